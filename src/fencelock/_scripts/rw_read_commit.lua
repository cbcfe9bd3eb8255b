-- rw_read_commit: second round of an N-server read grant; raise F while we are a reader.
-- KEYS[1] readers (zset: token -> expiry in server ms)   KEYS[2] fence register
-- ARGV[1] token      ARGV[2] merged fence (canonical decimal integer, at most 2^63 - 1)
-- ARGV[3] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- returns 1 when we are still a live reader and F >= the fence now; 0 not a reader: no change;
--         an error reply, nothing changed, when F or ARGV[2] is not a fence (compared exactly,
--         as decimal strings: see fence_math.lua)
-- #include fence_math.lua
-- #include waiting.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
if not reader_live(KEYS[1], ARGV[1], now_ms) then
  return 0
end
local previous, why = fence_raise(KEYS[2], ARGV[2], ARGV[3])
if not previous then return redis.error_reply(why) end
return 1
