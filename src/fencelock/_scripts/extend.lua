-- extend: compare-and-pexpire; the lease restarts at ARGV[2] ms from now.
-- KEYS[1] lock key   KEYS[2] holder info
-- ARGV[1] token      ARGV[2] new lease in ms
-- returns 1 extended (it was ours); 0 not ours: nothing changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
