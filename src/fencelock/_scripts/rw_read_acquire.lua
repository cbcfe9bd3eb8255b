-- rw_read_acquire: enter as one more reader unless a writer holds the lock or waits for it;
-- bump the rwlock's fence register (shared with writers) in the same round trip.
-- KEYS[1] writer's lock key   KEYS[2] fence register
-- KEYS[3] readers (zset: token -> expiry in server ms)   KEYS[4] writer intent marker
-- KEYS[5] waiters (zset: waiter id -> expiry in server ms)   KEYS[6] wake list
-- ARGV[1] token      ARGV[2] lease in ms      ARGV[3] holder info (unused)
-- ARGV[4] '1' when the caller was woken by a release signal, else '0'
-- ARGV[5] waiter id, stable over one acquire() call
-- ARGV[6] how long the caller will still wait, in ms (0: it will not wait)
-- ARGV[7] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- ARGV[8] the fence's TIME floor step in us (see fence_math.lua's fence_step_up; '0' or
--         absent: TIME itself)
-- returns {1, fence}   entered; fence = max(F + 1, server TIME in us), stored in F
--         {0, pttl_ms} refused: a writer holds it or waits (pttl of that key); a caller that
--                      will wait is registered as a waiter
-- A woken reader passes the wake signal on, so every reader waiting behind a writer enters.
-- The fence is a decimal string (exact past 2^53; see fence_math.lua); an error reply, nothing
-- changed, when F is not a fence or is at 2^63 - 1.
-- #include fence_math.lua
-- #include waiting.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local blocker = nil
if redis.call('EXISTS', KEYS[1]) == 1 then
  blocker = KEYS[1]
elseif redis.call('EXISTS', KEYS[4]) == 1 then
  -- rw_write_acquire always sets the intent with a PX: one without is stray, deleted
  if redis.call('PTTL', KEYS[4]) == -1 then redis.call('DEL', KEYS[4]) else blocker = KEYS[4] end
end
if blocker then
  local pttl = redis.call('PTTL', blocker)
  local patience = tonumber(ARGV[6])
  if patience > 0 then
    waiter_enlist(KEYS[5], ARGV[5], now_ms, waiter_hint(pttl, ARGV[2], patience))
  end
  return {0, pttl}
end
local fence, why = fence_issue(KEYS[2], now, ARGV[8], ARGV[7])
if not fence then return redis.error_reply(why) end
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
redis.call('ZADD', KEYS[3], now_ms + ttl, ARGV[1])
if redis.call('PTTL', KEYS[3]) < ttl then redis.call('PEXPIRE', KEYS[3], ttl) end
redis.call('ZREM', KEYS[5], ARGV[5])
if ARGV[4] == '1' then
  redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[5]) > 0 then
    redis.call('DEL', KEYS[6])
    redis.call('RPUSH', KEYS[6], '1')
    redis.call('PEXPIRE', KEYS[6], 5000)
  end
end
return {1, fence}
