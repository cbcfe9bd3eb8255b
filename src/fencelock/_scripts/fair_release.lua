-- fair_release: take the holder's own entry out of the queue (its waiter id is the token's
-- first 16 characters), compare-and-delete, then wake the head of the queue (and only it).
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (deleted with the lock: the info is in the
--         value now)
-- KEYS[3] queue (zset: waiter id -> arrival ticket)
-- KEYS[4] heartbeats (zset: waiter id -> expiry in server ms)
-- KEYS[5] wake prefix: a waiter's wake list is KEYS[5] .. ':' .. its id (same hash tag)
-- ARGV[1] token      ARGV[2] hand-off window in ms (unused: the queue decides who is next)
-- ARGV[3] wake element lifetime in ms
-- returns 1 released (it was ours); 0 not ours (expired, or another holder has it, or the
--         grant never landed here): only the holder's queue entry and wake list are gone
-- Either way, when the lock is free here the head is woken (waiters may block on this server
-- although the grant that is ending was won on the others).
-- #include lock_value.lua
local id = string.sub(ARGV[1], 1, 16)
redis.call('DEL', KEYS[5] .. ':' .. id)
if redis.call('ZREM', KEYS[3], id) == 1 then
  redis.call('ZREM', KEYS[4], id)
  if redis.call('ZCARD', KEYS[3]) == 0 then redis.call('DEL', KEYS[3], KEYS[4]) end
end
local ours = 0
if lock_held_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  redis.call('DEL', KEYS[1], KEYS[2])
  ours = 1
end
if redis.call('EXISTS', KEYS[3]) == 1 and redis.call('EXISTS', KEYS[1]) == 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now_ms, 'LIMIT', 0, 64)) do
    redis.call('ZREM', KEYS[3], id)
    redis.call('ZREM', KEYS[4], id)
  end
  local head = redis.call('ZRANGE', KEYS[3], 0, 0)
  if #head > 0 then
    local list = KEYS[5] .. ':' .. head[1]
    redis.call('DEL', list)
    redis.call('RPUSH', list, '1')
    redis.call('PEXPIRE', list, ARGV[3])
  else
    redis.call('DEL', KEYS[3], KEYS[4])
  end
end
return ours
