-- rw_write_acquire: take the write lock if no writer holds it and no reader is live; a writer
-- that will wait sets the intent marker, which stops new readers from entering.
-- KEYS[1] lock key (value: see lock_value.lua)   KEYS[2] fence register (shared with readers)
-- KEYS[3] holder info of fencelock 0.3 and older (unused)
--                           KEYS[4] waiters (zset: waiter id -> expiry in server ms)
-- KEYS[5] hand-off marker (unused; the plain lock's release sets it)
-- KEYS[6] readers (zset: token -> expiry in server ms)   KEYS[7] writer intent marker
-- ARGV[1] token      ARGV[2] lease in ms      ARGV[3] holder info ('' = none): kept in the lock key's value
-- ARGV[4] '1' when woken (unused)      ARGV[5] waiter id, stable over one acquire() call
-- ARGV[6] how long the caller will still wait, in ms (0: it will not wait)
-- ARGV[7] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- ARGV[8] the fence's TIME floor step in us (see fence_math.lua's fence_step_up; '0' or
--         absent: TIME itself)
-- returns {1, fence}   granted; fence = max(F + 1, server TIME in us), stored in F, so it is
--                      larger than every reader's and writer's fence issued here before
--         {0, pttl_ms} refused: a writer holds it, or readers are in (pttl: the longest
--                      reader lease left); a caller that will wait is registered as a waiter
--                      and (re)sets the intent for min(pttl + 1 s, its wait + 100 ms)
-- The fence is a decimal string (exact past 2^53; see fence_math.lua); an error reply, nothing
-- granted, when F is not a fence or is at 2^63 - 1.
-- #include fence_math.lua
-- #include waiting.lua
-- #include lock_value.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local function refuse(pttl)
  local patience = tonumber(ARGV[6])
  if patience <= 0 then return {0, pttl} end
  local hint = waiter_hint(pttl, ARGV[2], patience)
  redis.call('SET', KEYS[7], ARGV[5], 'PX', hint)
  waiter_enlist(KEYS[4], ARGV[5], now_ms, hint)
  return {0, pttl}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return refuse(redis.call('PTTL', KEYS[1]))
end
redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now_ms)
local last = redis.call('ZRANGE', KEYS[6], -1, -1, 'WITHSCORES')
if #last > 0 then
  return refuse(math.max(1, tonumber(last[2]) - now_ms))
end
local fence, why = fence_issue(KEYS[2], now, ARGV[8], ARGV[7])
if not fence then return redis.error_reply(why) end
redis.call('SET', KEYS[1], lock_value(ARGV[1], ARGV[3]), 'PX', ARGV[2])
if redis.call('GET', KEYS[7]) == ARGV[5] then redis.call('DEL', KEYS[7]) end
redis.call('ZREM', KEYS[4], ARGV[5])
return {1, fence}
