-- elect_read: the lock's holder and its info, read at once; registers an observer for wake-ups.
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (read when the value holds none)
-- KEYS[3] observers (zset: observer id -> expiry in
-- server ms); an observer's wake list is KEYS[3] .. ':' .. its id
-- ARGV[1] observer id ('' = none)   ARGV[2] how long the registration lasts, in ms
-- returns {token, pttl_ms, holder info}: token '' and pttl -2 when free, info '' when none.
-- The observer's wake list is left as it is: the read goes to every server and the observer
-- then blocks on one of them, so a wake pushed here just before this read may belong to a
-- change the other servers had not shown yet (emptying it lost that wake-up); a wake that is
-- older than the read only costs one more read.
-- #include lock_value.lua
if ARGV[1] ~= '' then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local lifetime = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[3], now_ms + lifetime, ARGV[1])
  if redis.call('PTTL', KEYS[3]) < lifetime then redis.call('PEXPIRE', KEYS[3], lifetime) end
end
local value = redis.call('GET', KEYS[1])
if not value or value == '' then  -- free, or the hand-off marker: nobody leads
  return {'', -2, ''}
end
local token = lock_token(value)
local info = string.sub(value, #token + 2)
if token == value then info = redis.call('GET', KEYS[2]) or '' end
return {token, redis.call('PTTL', KEYS[1]), info}
