-- sem_acquire: take a free slot (the proposed one first) and bump the ONE fence register.
-- KEYS[1] fence register             KEYS[2] waiters (zset: waiter id -> expiry in server ms)
-- KEYS[3 + 3i] slot i's lock key (value: see lock_value.lua)
-- KEYS[4 + 3i] slot i's holder info of fencelock 0.3 and older (unused)
-- KEYS[5 + 3i] slot i's hand-off marker of fencelock 0.3 and older (unused: the marker is the
--              slot's lock key's empty value now)   (variadic: 3 keys per slot, i = 0..limit-1)
-- KEYS[#KEYS - 1] the limit key (the limit of the semaphore's permits; TTL: the longest
--                 lease granted)           KEYS[#KEYS] slot 'limit''s lock key (out of range)
-- ARGV[1] token      ARGV[2] lease in ms      ARGV[3] holder info ('' = none): kept in the slot's lock key's value
-- ARGV[4] '1' when the caller was woken by a release signal, else '0'
-- ARGV[5] waiter id, stable over one acquire() call
-- ARGV[6] how long the caller will still wait, in ms (0: it will not wait)
-- ARGV[7] the proposed slot (0-based; absent, or out of range: none): tried first, then the
--         others in KEYS order
-- ARGV[8] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- returns {1, fence, slot}  granted slot (0-based, the first free one in that order);
--                           fence = max(F + 1, server TIME in us), stored in F
--         {0, pttl_ms}      every slot is taken (pttl: the shortest time until one frees,
--                           -1 unknown); a caller that will wait is registered as a waiter
--         {2, limit}        another limit is in use on this name (-1: unknown, a slot
--                           beyond ours is held): nothing changed
-- A slot holding the hand-off marker (a release woke a waiter) is skipped unless woken; a
-- marker without a TTL is stray and taken like a free slot.
-- The fence is a decimal string (exact past 2^53; see fence_math.lua); an error reply, nothing
-- granted, when F is not a fence or is at 2^63 - 1.
-- #include fence_math.lua
-- #include waiting.lua
-- #include lock_value.lua
local now = redis.call('TIME')
local woken = ARGV[4] == '1'
local shortest = -1
local slots = (#KEYS - 4) / 3
local limit_key = KEYS[#KEYS - 1]
local stored = tonumber(redis.call('GET', limit_key) or '')
if stored and stored ~= slots then return {2, stored} end
if redis.call('EXISTS', KEYS[#KEYS]) == 1 then return {2, -1} end
local proposed = tonumber(ARGV[7] or '') or -1
if proposed >= slots then proposed = -1 end
-- a permit's value carries the waiters' mark from the start (lock_value.lua): its release
-- (release.lua, on the slot) always looks for the semaphore's waiters, which this script
-- registers without marking any slot
local value = lock_marked(lock_value(ARGV[1], ARGV[3]))
local function grant(i, key)
  local fence, why = fence_issue(KEYS[1], now, nil, ARGV[8])
  if not fence then
    redis.call('DEL', key)  -- just taken by us: no permit without a fence
    return redis.error_reply(why)
  end
  if redis.call('PTTL', limit_key) < tonumber(ARGV[2]) then
    redis.call('SET', limit_key, slots, 'PX', ARGV[2])
  end
  redis.call('ZREM', KEYS[2], ARGV[5])
  return {1, fence, i}
end
for step = 0, slots - 1 do
  local i = step  -- the proposed slot first, then the others in order
  if step == 0 then i = math.max(proposed, 0) elseif step <= proposed then i = step - 1 end
  local key = KEYS[3 + 3 * i]
  if redis.call('SET', key, value, 'NX', 'PX', ARGV[2]) then return grant(i, key) end
  local pttl = redis.call('PTTL', key)
  -- the slot's hand-off marker (its empty value, see lock_value.lua): kept for a woken waiter
  -- for its window; one without a TTL is stray (release.lua always sets a PX): not obeyed
  if (woken or pttl == -1) and redis.call('GET', key) == '' then
    redis.call('SET', key, value, 'PX', ARGV[2])
    return grant(i, key)
  end
  if pttl >= 0 and (shortest < 0 or pttl < shortest) then shortest = pttl end
end
local patience = tonumber(ARGV[6])
if patience > 0 then
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  waiter_enlist(KEYS[2], ARGV[5], now_ms, waiter_hint(shortest, ARGV[2], patience))
end
return {0, shortest}
