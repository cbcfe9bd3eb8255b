-- rw_read_extend: restart one reader's lease at ARGV[2] ms from now if it is still live.
-- KEYS[1] readers (zset: token -> expiry in server ms)
-- ARGV[1] token      ARGV[2] new lease in ms
-- returns 1 extended; 0 not a live reader (expired or released): nothing changed
-- #include waiting.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if not reader_live(KEYS[1], ARGV[1], now_ms) then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now_ms + ttl, ARGV[1])
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
