-- release: compare-and-delete; wake one waiter if any is still registered.
-- KEYS[1] lock key   KEYS[2] holder info   KEYS[3] waiters (zset: id -> expiry in server ms)
-- KEYS[4] wake list  KEYS[5] hand-off marker
-- ARGV[1] token      ARGV[2] hand-off window in ms   ARGV[3] wake element lifetime in ms
-- returns 1 released (it was ours); 0 not ours (expired, or another holder has it): nothing changed
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now_ms)
  if redis.call('ZCARD', KEYS[3]) > 0 then
    redis.call('DEL', KEYS[4])
    redis.call('RPUSH', KEYS[4], '1')
    redis.call('PEXPIRE', KEYS[4], ARGV[3])
    redis.call('SET', KEYS[5], '1', 'PX', ARGV[2])
  end
end
return 1
