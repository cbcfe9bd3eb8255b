-- fair_acquire: queue the caller by arrival ticket, and grant only to the head of the queue.
-- KEYS[1] lock key (value: see lock_value.lua)                  KEYS[2] fence register
-- KEYS[3] holder info of fencelock 0.3 and older (unused)
-- KEYS[4] queue (zset: waiter id -> arrival ticket)
-- KEYS[5] heartbeats (zset: waiter id -> expiry in server ms)
-- KEYS[6] wake prefix: a waiter's wake list is KEYS[6] .. ':' .. its id (same hash tag)
-- ARGV[1] token               ARGV[2] lease in ms                 ARGV[3] holder info ('' = none): kept in the lock key's value
-- ARGV[4] waiter id, stable over one acquire() call ('-': a caller that will not wait); the
--         token starts with it (fair_release finds the holder's entry from the token)
-- ARGV[5] the caller's ticket ('0': not known yet; an arrival here proposes one)
-- ARGV[6] heartbeat lease of the caller's queue entry, in ms
-- ARGV[7] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- ARGV[8] the fence's TIME floor step in us (see fence_math.lua's fence_step_up; '0' or
--         absent: TIME itself)
-- returns {1, fence}          granted; fence = max(F + 1, server TIME in us), stored in F; the
--                             caller's wake list is gone, its entry stays (it keeps its place
--                             if the grant does not reach a majority) until fair_release
--         {0, pttl_ms, ticket} refused: another holder has it (pttl_ms, -1 unknown), or it is
--                             free but an earlier waiter is ahead (pttl_ms = 0); ticket = the
--                             caller's position here (0 for '-'): ARGV[5], or a proposal
--                             max(last ticket + 1, server TIME in us) for a new arrival
-- Entries whose heartbeat ran out (a waiter that died) are removed first (64 per call at most).
-- The fence is a decimal string (exact past 2^53; see fence_math.lua); an error reply, nothing
-- granted, when F is not a fence or is at 2^63 - 1.
-- #include fence_math.lua
-- #include lock_value.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now_ms, 'LIMIT', 0, 64)) do
  redis.call('ZREM', KEYS[4], id)
  redis.call('ZREM', KEYS[5], id)
end
local id = ARGV[4]
local ticket = 0
if id ~= '-' then
  local beat = tonumber(ARGV[6])
  ticket = tonumber(ARGV[5])
  if ticket == 0 then
    ticket = tonumber(redis.call('ZSCORE', KEYS[4], id) or '0')
  end
  if ticket == 0 then
    ticket = now_us
    local last = redis.call('ZRANGE', KEYS[4], -1, -1, 'WITHSCORES')
    if #last > 0 then ticket = math.max(ticket, tonumber(last[2]) + 1) end
  end
  redis.call('ZADD', KEYS[4], string.format('%.0f', ticket), id)
  redis.call('ZADD', KEYS[5], now_ms + beat, id)
  for _, queue in ipairs({KEYS[4], KEYS[5]}) do
    if redis.call('PTTL', queue) < beat then redis.call('PEXPIRE', queue, beat) end
  end
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('PTTL', KEYS[1]), string.format('%.0f', ticket)}
end
local head = redis.call('ZRANGE', KEYS[4], 0, 0)
if #head > 0 and head[1] ~= id then
  return {0, 0, string.format('%.0f', ticket)}
end
local fence, why = fence_issue(KEYS[2], now, ARGV[8], ARGV[7])
if not fence then return redis.error_reply(why) end
redis.call('SET', KEYS[1], lock_value(ARGV[1], ARGV[3]), 'PX', ARGV[2])
if id ~= '-' then redis.call('DEL', KEYS[6] .. ':' .. id) end
return {1, fence}
