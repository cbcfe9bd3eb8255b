-- fence_write: store a value only if its fence is not older than the newest fence accepted.
-- KEYS[1] the resource's hash (fields 'value' and 'fence'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- ARGV[2] the value to store
-- returns {1, fence}    accepted: value and fence stored (equal fences are accepted)
--         {0, current}  refused: current (decimal string) is newer; nothing changed
-- Fences are compared as decimal strings (length first), so they stay exact above 2^53.
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local current = redis.call('HGET', KEYS[1], 'fence') or '0'
if older(ARGV[1], current) then
  return {0, current}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1, ARGV[1]}
