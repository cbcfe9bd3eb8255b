-- release: compare-and-delete; then hand the lock to the waiters, or wake one of them.
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (deleted with the lock: the info is in the
--         value now)
-- KEYS[3] waiters (zset: id -> expiry in server ms)
-- KEYS[4] wake list  KEYS[5] hand-off marker of fencelock 0.3 and older (unused: see below)
-- KEYS[6] fence register                  KEYS[7] claimed list
-- ARGV[1] token      ARGV[2] hand-off window in ms   ARGV[3] wake element lifetime in ms
-- ARGV[4] the next holder's token, starting with 'h' ('': only wake a waiter)
-- ARGV[5] the next holder's lease in ms    ARGV[6] the releaser's waiter id ('-': none),
--         removed from KEYS[3] whether or not the lock is ours here (absent: none)
-- ARGV[7] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- ARGV[8] (optional) the fence of the grant this release is for: a token that is granted
--         again (the compat layer's, chosen by the caller) is ours only while KEYS[6] holds
--         that grant's fence (or nothing: gone after its retention), not after the same
--         token's next grant
-- returns 1 released (it was ours); 0 not ours (expired, or another holder has it): nothing changed
-- With a waiter still registered: given a next token, the lock is granted at once under it
-- (PX ARGV[5], fence = max(F + 1, server TIME in us), stored in F) and the wake list holds
-- one element 'token fence lease_ms window_ms' for window_ms = ARGV[2] ms: the first waiter
-- blocked on it claims the grant by moving it to KEYS[7] (BLMOVE); an unclaimed one is void
-- once it expired (see acquire.lua; a release of the grant's token removes its element).
-- Without a next token, one waiter is woken to try again, and newcomers step aside for
-- ARGV[2] ms: the lock key holds the hand-off marker (its empty value, see lock_value.lua)
-- that long; so too when F is not a fence or is at 2^63 - 1 (the woken waiter's acquire
-- then answers why: a release never fails for want of a next fence).
-- the releaser's own registration goes first, whoever holds the lock here: a waiter granted
-- on a majority is still registered where its attempt was refused (a server the last holder's
-- release had not reached yet), and there the lock is not this lease's
if ARGV[6] and ARGV[6] ~= '-' then redis.call('ZREM', KEYS[3], ARGV[6]) end
if ARGV[8] then
  local fence = redis.call('GET', KEYS[6])
  if fence and fence ~= ARGV[8] then return 0 end
end
local value = redis.call('GET', KEYS[1])
-- the common cases, written out so that they build no Lua function (one is built on every
-- call): our token, not a hand-over's, with holder info and without the waiters' mark, or bare
-- (the compat layer's: it carries no mark) with nobody registered to wait (see lock_value.lua)
if value and ARGV[1] ~= '' and string.byte(ARGV[1], 1) ~= 104
    and string.sub(value, 1, #ARGV[1]) == ARGV[1] then
  local after = string.byte(value, #ARGV[1] + 1)
  if after == 255 or after == nil and redis.call('EXISTS', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[7])
    return 1
  end
end
-- #include lock_value.lua
if not lock_held_by(value, ARGV[1]) then
  return 0
end
-- the claimed list goes too: a handed-over grant's claim goes with it, and a claim left by an
-- earlier holder that is gone (the lock was free when we took it) is over
redis.call('DEL', KEYS[1], KEYS[2], KEYS[7])
if string.byte(ARGV[1], 1) == 104 then
  -- a handed-over grant released before anyone claimed it (an admin release within the
  -- window): its element must not be claimed later, when the lock key may be someone else's
  local mine = ARGV[1] .. ' '
  for _, element in ipairs(redis.call('LRANGE', KEYS[4], 0, 7)) do
    if string.sub(element, 1, #mine) == mine then
      redis.call('DEL', KEYS[4])
      break
    end
  end
end
-- (a value without the waiters' mark: nobody asked to wait while it was held, see
-- lock_value.lua; the fence arithmetic is only included past this point, so that a release
-- nobody waits for does not build its functions)
if not lock_may_have_waiters(value, ARGV[1]) or redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
-- #include fence_math.lua
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
if redis.call('ZCARD', KEYS[3]) > 0 then
  redis.call('DEL', KEYS[4])
  local fence = nil
  if ARGV[4] ~= '' then fence = fence_issue(KEYS[6], now, nil, ARGV[7]) end
  if fence then
    redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
    redis.call('RPUSH', KEYS[4], ARGV[4] .. ' ' .. fence .. ' ' .. ARGV[5] .. ' ' .. ARGV[2])
    redis.call('PEXPIRE', KEYS[4], ARGV[2])
  else
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], ARGV[3])
    redis.call('SET', KEYS[1], '', 'PX', ARGV[2])
  end
end
return 1
