-- rw_read_release: leave as a reader; the last reader out wakes every waiter (up to 64), so
-- that a waiting writer is among them (readers it wakes are refused again by its intent).
-- KEYS[1] readers (zset: token -> expiry in server ms)
-- KEYS[2] waiters (zset: waiter id -> expiry in server ms)   KEYS[3] wake list
-- ARGV[1] token      ARGV[2] hand-off window in ms (unused)   ARGV[3] wake element lifetime in ms
-- ARGV[4], ARGV[5] (unused: a Lock's release takes them)
-- ARGV[6] the releaser's waiter id ('-' or absent: none): its registration in KEYS[2] goes,
--         whether or not it is a live reader here (a reader granted by a majority stays
--         registered where its winning attempt was refused)
-- returns 1 released (it was a live reader); 0 not a live reader: nothing changed
-- #include waiting.lua
if ARGV[6] and ARGV[6] ~= '-' then redis.call('ZREM', KEYS[2], ARGV[6]) end
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then
  return 0
end
if redis.call('ZCARD', KEYS[1]) == 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  waiters_wake(KEYS[2], KEYS[3], now_ms, ARGV[3])
end
return 1
