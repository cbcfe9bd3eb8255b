-- fence_advance: check-and-advance the resource's fence without touching its value.
-- KEYS[1] the resource's hash (fields 'value' and 'fence'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- returns {1, fence}    accepted: the fence is now ARGV[1] (it was older or equal)
--         {0, current}  refused: current (decimal string) is newer; nothing changed
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local current = redis.call('HGET', KEYS[1], 'fence') or '0'
if older(ARGV[1], current) then
  return {0, current}
end
if current ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'fence', ARGV[1])
end
return {1, ARGV[1]}
