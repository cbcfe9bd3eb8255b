-- extend: compare-and-pexpire; the lease restarts at ARGV[2] ms from now.
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (unused: the holder info is in the value)
-- ARGV[1] token      ARGV[2] new lease in ms
-- returns 1 extended (it was ours); 0 not ours: nothing changed
-- #include lock_value.lua
if not lock_held_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
