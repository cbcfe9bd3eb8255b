-- fence_commit: second round of an N-server grant; raise F to the merged fence while we hold.
-- KEYS[1] lock key   KEYS[2] fence register
-- ARGV[1] token      ARGV[2] merged fence (decimal integer)
-- returns 1 when the key is still ours and F >= the fence now; 0 not ours: nothing changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return 1
