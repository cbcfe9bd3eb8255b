-- elect_read: the lock's holder and its info, read at once; registers an observer for wake-ups.
-- KEYS[1] lock key   KEYS[2] holder info   KEYS[3] observers (zset: observer id -> expiry in
-- server ms); an observer's wake list is KEYS[3] .. ':' .. its id
-- ARGV[1] observer id ('' = none)   ARGV[2] how long the registration lasts, in ms
-- returns {token, pttl_ms, holder info}: token '' and pttl -2 when free, info '' when none;
--         the observer's wake list is emptied (what it held is older than this read)
if ARGV[1] ~= '' then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local lifetime = tonumber(ARGV[2])
  redis.call('ZADD', KEYS[3], now_ms + lifetime, ARGV[1])
  if redis.call('PTTL', KEYS[3]) < lifetime then redis.call('PEXPIRE', KEYS[3], lifetime) end
  redis.call('DEL', KEYS[3] .. ':' .. ARGV[1])
end
local token = redis.call('GET', KEYS[1])
if not token then
  return {'', -2, ''}
end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or ''}
