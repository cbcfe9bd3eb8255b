-- sem_acquire: take the first free slot of a semaphore and bump its ONE fence register.
-- KEYS[1] fence register (no TTL)     KEYS[2] waiters (zset: waiter id -> expiry in server ms)
-- KEYS[3 + 3i] slot i's lock key      KEYS[4 + 3i] slot i's holder info
-- KEYS[5 + 3i] slot i's hand-off marker             (variadic: 3 keys per slot, i = 0..limit-1)
-- ARGV[1] token      ARGV[2] lease in ms      ARGV[3] holder info ('' = none)
-- ARGV[4] '1' when the caller was woken by a release signal, else '0'
-- ARGV[5] waiter id, stable over one acquire() call
-- ARGV[6] how long the caller will still wait, in ms (0: it will not wait)
-- returns {1, fence, slot}  granted slot (0-based, the first free one in KEYS order);
--                           fence = max(F + 1, server TIME in us), stored in F
--         {0, pttl_ms}      every slot is taken (pttl: the shortest time until one frees,
--                           -1 unknown); a caller that will wait is registered as a waiter
-- A slot whose hand-off marker is set (a release woke a waiter) is skipped unless woken.
local now = redis.call('TIME')
local woken = ARGV[4] == '1'
local shortest = -1
local slots = (#KEYS - 2) / 3
for i = 0, slots - 1 do
  local key = KEYS[3 + 3 * i]
  local marker = KEYS[5 + 3 * i]
  local pttl
  if not woken and redis.call('EXISTS', marker) == 1 then
    pttl = redis.call('PTTL', marker)
  elseif redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2]) then
    if woken then redis.call('DEL', marker) end
    redis.call('ZREM', KEYS[2], ARGV[5])
    local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
    local fence = math.max(tonumber(redis.call('GET', KEYS[1]) or '0') + 1, now_us)
    redis.call('SET', KEYS[1], string.format('%.0f', fence))
    if ARGV[3] ~= '' then redis.call('SET', KEYS[4 + 3 * i], ARGV[3], 'PX', ARGV[2]) end
    return {1, fence, i}
  else
    pttl = redis.call('PTTL', key)
  end
  if pttl >= 0 and (shortest < 0 or pttl < shortest) then shortest = pttl end
end
local patience = tonumber(ARGV[6])
if patience > 0 then
  local hint = tonumber(ARGV[2])
  if shortest > 0 then hint = shortest + 1000 end
  hint = math.min(hint, patience + 100)
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('ZADD', KEYS[2], now_ms + hint, ARGV[5])
  if redis.call('PTTL', KEYS[2]) < hint then redis.call('PEXPIRE', KEYS[2], hint) end
end
return {0, shortest}
