-- fence_apply: add an integer to the resource's value under the fence, with an optional floor.
-- KEYS[1] the resource's hash (fields 'value', 'fence', 'token'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- ARGV[2] amount to add (decimal integer, |amount| <= 2^53 - 1; negative to subtract)
-- ARGV[3] floor: the lowest value allowed after the update (decimal integer), '' for none
-- ARGV[4] the offering lease's token, '' (or absent) for none
-- returns {1, new}      applied: value = new (decimal string), fence = ARGV[1], token = ARGV[4]
--         {0, current}  refused, stale: current fence (decimal string) is newer
--         {4, current}  refused: the current fence equals the offered one but was accepted
--                       with another token (another lease)
--         {2, value}    refused, the result would be below the floor (value = current value)
--         {3, value}    refused, the current value is not an integer within +-(2^53 - 1),
--                       or the result would leave that range (value = current value or '')
-- Every refusal changes nothing. A missing value counts as 0. Fences are compared as decimal
-- strings (exact above 2^53); only the value and the amount are Lua numbers.
-- #include fence_guard.lua
local LIMIT = 9007199254740991
local token = ARGV[4] or ''
local refused, current, holder = fence_check(KEYS[1], ARGV[1], token)
if refused then return refused end
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
fence_stamp(KEYS[1], token, holder)
return {1, text}
