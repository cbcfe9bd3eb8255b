-- elect_announce: name the leader beside the lock it holds, then wake every observer.
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (unused)
-- KEYS[3] observers (zset: observer id -> expiry in
-- server ms); an observer's wake list is KEYS[3] .. ':' .. its id (same hash tag)
-- ARGV[1] token ('' = only wake the observers: a term ended)
-- ARGV[2] holder info naming the leader and its term (JSON)   ARGV[3] wake list lifetime in ms
-- returns 1 announced (the lock is ours here) or observers woken; 0 not ours here: nothing
--         named, but the observers are woken all the same (one blocked on this server would
--         otherwise sleep through a term that a majority elsewhere granted)
-- #include lock_value.lua
local ours = 1
if ARGV[1] ~= '' then
  local value = redis.call('GET', KEYS[1])
  if lock_held_by(value, ARGV[1]) then
    local named = lock_value(ARGV[1], ARGV[2])
    -- a waiters' mark is kept, and a bare token, which could not carry one, gets it (see
    -- lock_value.lua)
    if lock_may_have_waiters(value, ARGV[1]) then named = lock_marked(named) end
    redis.call('SET', KEYS[1], named, 'KEEPTTL')
  else
    ours = 0
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    local list = KEYS[3] .. ':' .. id
    redis.call('RPUSH', list, '1')
    redis.call('PEXPIRE', list, ARGV[3])
  end
end
return ours
