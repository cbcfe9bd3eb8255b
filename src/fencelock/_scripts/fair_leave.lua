-- fair_leave: a waiter leaves the queue (it gave up, was cancelled, or was granted elsewhere);
-- when it was the head and the lock is free here, the new head is woken.
-- KEYS[1] lock key
-- KEYS[2] queue (zset: waiter id -> arrival ticket)
-- KEYS[3] heartbeats (zset: waiter id -> expiry in server ms)
-- KEYS[4] wake prefix: a waiter's wake list is KEYS[4] .. ':' .. its id (same hash tag)
-- ARGV[1] waiter id   ARGV[2] wake element lifetime in ms
-- returns 1 the entry was here and is gone; 0 it was not here: nothing changed but its wake list
local id = ARGV[1]
redis.call('DEL', KEYS[4] .. ':' .. id)
local head = redis.call('ZRANGE', KEYS[2], 0, 0)
if redis.call('ZREM', KEYS[2], id) == 0 then
  return 0
end
redis.call('ZREM', KEYS[3], id)
local first = redis.call('ZRANGE', KEYS[2], 0, 0)
if #first == 0 then
  redis.call('DEL', KEYS[2], KEYS[3])
elseif head[1] == id and redis.call('EXISTS', KEYS[1]) == 0 then
  local list = KEYS[4] .. ':' .. first[1]
  redis.call('DEL', list)
  redis.call('RPUSH', list, '1')
  redis.call('PEXPIRE', list, ARGV[2])
end
return 1
