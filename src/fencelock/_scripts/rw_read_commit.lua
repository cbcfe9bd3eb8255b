-- rw_read_commit: second round of an N-server read grant; raise F while we are a reader.
-- KEYS[1] readers (zset: token -> expiry in server ms)   KEYS[2] fence register
-- ARGV[1] token      ARGV[2] merged fence (decimal integer)
-- returns 1 when we are still a live reader and F >= the fence now; 0 not a reader: no change
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local expiry = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not expiry or tonumber(expiry) <= now_ms then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
