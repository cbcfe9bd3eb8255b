-- sem_fence_commit: second round of an N-server permit; raise F to the merged fence while we
-- hold the slot, and say what F was, so that two permits granted at once never share a fence.
-- KEYS[1] the slot's lock key   KEYS[2] the semaphore's fence register
-- ARGV[1] token                 ARGV[2] merged fence (decimal integer)
-- returns {1, previous F}  the key is still ours and F >= the fence now (previous F as a
--                          decimal string: '0' when none); the caller judges the previous F
--         {0}              not ours: nothing changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
local previous = redis.call('GET', KEYS[2]) or '0'
if tonumber(previous) < tonumber(ARGV[2]) then
  redis.call('SET', KEYS[2], ARGV[2])
end
return {1, previous}
