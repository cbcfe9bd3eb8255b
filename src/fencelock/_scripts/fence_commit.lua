-- fence_commit: second round of an N-server grant; raise F to the merged fence while we hold.
-- KEYS[1] lock key (value: see lock_value.lua)   KEYS[2] fence register
-- ARGV[1] token      ARGV[2] merged fence (canonical decimal integer, at most 2^63 - 1)
-- ARGV[3] the fence register's retention in ms ('0' or absent: for ever; see fence_store)
-- returns 1 when the key is still ours and F >= the fence now; 0 not ours: nothing changed;
--         an error reply, nothing changed, when F or ARGV[2] is not a fence (compared exactly,
--         as decimal strings: see fence_math.lua)
-- #include fence_math.lua
-- #include lock_value.lua
if not lock_held_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
local previous, why = fence_raise(KEYS[2], ARGV[2], ARGV[3])
if not previous then return redis.error_reply(why) end
return 1
