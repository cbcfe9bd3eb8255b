-- fence_apply: add an integer to the resource's value under the fence, with an optional floor.
-- KEYS[1] the resource's hash (fields 'value' and 'fence'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- ARGV[2] amount to add (decimal integer, |amount| <= 2^53 - 1; negative to subtract)
-- ARGV[3] floor: the lowest value allowed after the update (decimal integer), '' for none
-- returns {1, new}      applied: value = new (decimal string), fence = ARGV[1]
--         {0, current}  refused, stale: current fence (decimal string) is newer
--         {2, value}    refused, the result would be below the floor (value = current value)
--         {3, value}    refused, the current value is not an integer within +-(2^53 - 1),
--                       or the result would leave that range (value = current value or '')
-- Every refusal changes nothing. A missing value counts as 0.
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
local LIMIT = 9007199254740991
local current = redis.call('HGET', KEYS[1], 'fence') or '0'
if older(ARGV[1], current) then
  return {0, current}
end
local raw = redis.call('HGET', KEYS[1], 'value')
local value = 0
if raw then
  if not string.match(raw, '^-?%d+$') then return {3, raw} end
  value = tonumber(raw)
  if math.abs(value) > LIMIT then return {3, raw} end
end
local new = value + tonumber(ARGV[2])
if math.abs(new) > LIMIT then return {3, raw or ''} end
if ARGV[3] ~= '' and new < tonumber(ARGV[3]) then
  return {2, raw or '0'}
end
local text = string.format('%.0f', new)
redis.call('HSET', KEYS[1], 'value', text, 'fence', ARGV[1])
return {1, text}
