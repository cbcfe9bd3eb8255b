-- acquire: take the lock if it is free and bump the fence register, in one round trip.
-- KEYS[1] lock key (value: see lock_value.lua)                  KEYS[2] fence register
-- KEYS[3] holder info of fencelock 0.3 and older (unused)
-- KEYS[4] waiters (zset: waiter id -> expiry in server ms)
-- KEYS[5] hand-off marker of fencelock 0.3 and older (unused: the marker is the lock key's
--         empty value now, see lock_value.lua)
-- KEYS[6] wake list           KEYS[7] claimed list (a claimed hand-off grant's element)
-- ARGV[1] token               ARGV[2] lease in ms                 ARGV[3] holder info ('' = none): kept in the lock key's value
-- ARGV[4] '1' when the caller was woken by a release signal, else '0'
-- ARGV[5] waiter id, stable over one acquire() call ('-': a caller that will not wait);
--         '+' before it on the call's first attempt: registered nowhere yet, so a grant has
--         no registration to remove (a refusal registers the id without the '+')
-- ARGV[6] how long the caller will still wait, in ms (0: it will not wait)
-- ARGV[7] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- ARGV[8] the fence's TIME floor step in us (see fence_math.lua's fence_step_up; '0' or
--         absent: TIME itself)
-- returns {1, fence}   granted; fence = max(F + 1, server TIME in us stepped up by ARGV[8]),
--                      stored in F (a decimal string: exact past 2^53; see fence_math.lua)
--         {0, pttl_ms} refused: another holder has it (or a woken waiter has the right of way:
--                      the hand-off marker, the lock key's empty value;
--                      or a handed-over grant waits to be claimed: pttl_ms = its window left);
--                      a caller that will wait is registered as a waiter until
--                      min(pttl + 1 s, its remaining wait + 100 ms) from now
-- A grant that release.lua handed to the waiters (its token starts with 'h') and that no
-- waiter claimed before its wake element expired (nobody moved it to KEYS[7]) is void: the
-- caller takes its place. A hand-off marker without a TTL is stray (release.lua always sets a
-- PX): it is deleted, not obeyed.
-- An error reply, nothing granted, when F is not a fence or is at 2^63 - 1.
local now = redis.call('TIME')
-- (lock_value.lua's lock_value(ARGV[1], ARGV[3]) and, for a waiter's grant, lock_marked of it,
-- written out, as is the common case of the fence's issue below: a Lua function is built on
-- every call, and the free lock's grant builds one only)
local value = ARGV[1]
if ARGV[3] ~= '' then value = value .. '\255' .. ARGV[3] end
-- a waiter taking the lock with others still waiting marks its value, so that its release
-- wakes them (see lock_value.lua); a newcomer's grant reads nothing more
local function granted(fence)
  if ARGV[5] ~= '-' and string.byte(ARGV[5]) ~= 43
      and redis.call('ZREM', KEYS[4], ARGV[5]) == 1
      and ARGV[3] ~= ''
      and redis.call('ZCARD', KEYS[4]) > 0 then
    redis.call('SET', KEYS[1], ARGV[1] .. '\254' .. ARGV[3], 'KEEPTTL')
  end
  return {1, fence}
end
-- (the lock was free: a claim left in KEYS[7] by a holder that is gone is over, but it is
-- harmless until the next hand-over, which starts a new list, and the release deletes it)
local free = redis.call('SET', KEYS[1], value, 'NX', 'PX', ARGV[2])
local floor, old
local keep = ARGV[7] or '0'
if free and (ARGV[8] or '0') == '0' and (keep == '0' or string.find(keep, '^[1-9]%d*$')) then
  -- fence_issue(KEYS[2], now, ARGV[8], ARGV[7]) for TIME unstepped, as far as the common case
  -- goes: the floor, fence_time(now), is the fence when F is absent or digits below it, and
  -- fence_keep keeps it for the retention (a fence at TIME is never ahead of the clock)
  floor = now[1] .. string.sub('00000' .. now[2], -6)
  if keep == '0' then
    old = redis.pcall('SET', KEYS[2], floor, 'GET')
  else
    old = redis.pcall('SET', KEYS[2], floor, 'GET', 'PX', keep)
  end
  if not old or type(old) == 'string' and (#old < #floor or #old == #floor and old < floor)
      and string.find(old, '^%d+$') then
    return granted(floor)
  end
end
-- #include fence_math.lua
local function grant()
  local fence, why
  if floor then
    fence, why = fence_settle(KEYS[2], now, ARGV[7], floor, old)  -- (SET ... GET sent above)
  else
    fence, why = fence_issue(KEYS[2], now, ARGV[8], ARGV[7])
  end
  if not fence then
    redis.call('DEL', KEYS[1])  -- just taken by us: no grant without a fence
    return redis.error_reply(why)
  end
  return granted(fence)
end
if free then return grant() end
-- #include lock_value.lua
-- (the waiter queue's functions are only built past the free lock's grant)
-- #include waiting.lua
local function refuse(pttl)
  local patience = tonumber(ARGV[6])
  if patience <= 0 then return {0, pttl} end
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local waiter = ARGV[5]
  if string.byte(waiter) == 43 then waiter = string.sub(waiter, 2) end  -- '+': first attempt
  waiter_enlist(KEYS[4], waiter, now_ms, waiter_hint(pttl, ARGV[2], patience))
  return {0, pttl}
end
local holder = redis.call('GET', KEYS[1])
if holder == '' then
  -- the hand-off marker: a woken waiter takes the lock, a newcomer steps aside for the window.
  -- release.lua always sets it with a PX: one without (restored, persisted, written by hand)
  -- would turn every newcomer away for ever, so it is not obeyed
  local marker = redis.call('PTTL', KEYS[1])
  if ARGV[4] ~= '1' and marker >= 0 then return refuse(marker) end
  redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
  return grant()
end
local function claimed(token)
  for _, element in ipairs(redis.call('LRANGE', KEYS[7], 0, 7)) do
    if string.sub(element, 1, #token + 1) == token .. ' ' then return true end
  end
  return false
end
if holder and string.byte(holder, 1) == 104 and not claimed(lock_token(holder)) then
  if redis.call('EXISTS', KEYS[6]) == 0 then
    redis.call('DEL', KEYS[7])
    redis.call('SET', KEYS[1], value, 'PX', ARGV[2])
    return grant()
  end
  -- still waiting to be claimed: the caller blocks for what is left of the window (claiming
  -- it, or back in time to take the place of a void grant), not for the whole lease
  return refuse(redis.call('PTTL', KEYS[6]))
end
-- held: a caller that will wait marks the holder's value, so that its release wakes one
if tonumber(ARGV[6]) > 0 and holder then
  local marked = lock_marked(holder)
  if marked ~= holder then redis.call('SET', KEYS[1], marked, 'KEEPTTL') end
end
return refuse(redis.call('PTTL', KEYS[1]))
