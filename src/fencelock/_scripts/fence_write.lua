-- fence_write: store a value only if its fence is newer than the one accepted, or equal and
-- offered by the same lease.
-- KEYS[1] the resource's hash (fields 'value', 'fence', 'token'; no TTL)
-- ARGV[1] offered fence (canonical non-negative decimal, no leading zeros)
-- ARGV[2] the value to store
-- ARGV[3] the offering lease's token, '' (or absent) for none
-- returns {1, fence}    accepted: value, fence and token stored
--         {0, current}  refused: current (decimal string) is newer; nothing changed
--         {4, current}  refused: current equals the offered fence but was accepted with another
--                       token (another lease); nothing changed
-- Fences are compared as decimal strings (length first), so they stay exact above 2^53. An
-- equal fence is accepted only with the token stored beside it ('' = no token on both sides).
-- #include fence_guard.lua
local token = ARGV[3] or ''
local refused, current, holder = fence_check(KEYS[1], ARGV[1], token)
if refused then return refused end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
fence_stamp(KEYS[1], token, holder)
return {1, ARGV[1]}
