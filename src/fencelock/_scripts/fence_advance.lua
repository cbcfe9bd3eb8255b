-- fence_advance: check-and-advance the resource's fence; the value is kept, or dropped to leave
-- a tombstone (a deleted resource that still refuses older fences).
-- KEYS[1] the resource's hash (fields 'value', 'fence', 'token'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- ARGV[2] the offering lease's token, '' (or absent) for none
-- ARGV[3] '1' to delete the value (the hash keeps fence and token), '' (or absent) to keep it
-- returns {1, fence}    accepted: the fence is now ARGV[1], with ARGV[2] as its token
--         {0, current}  refused: current (decimal string) is newer; nothing changed
--         {4, current}  refused: current equals the offered fence but was accepted with another
--                       token (another lease); nothing changed
-- #include fence_guard.lua
local token = ARGV[2] or ''
local refused, current, holder = fence_check(KEYS[1], ARGV[1], token)
if refused then return refused end
if ARGV[3] == '1' then
  redis.call('HDEL', KEYS[1], 'value')
end
if current ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'fence', ARGV[1])
  fence_stamp(KEYS[1], token, holder)
end
return {1, ARGV[1]}
