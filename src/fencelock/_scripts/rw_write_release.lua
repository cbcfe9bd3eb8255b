-- rw_write_release: compare-and-delete the write lock; wake every waiter (up to 64): readers
-- waiting behind the writer may all enter now, and a waiting writer must not miss its turn.
-- KEYS[1] lock key (value: see lock_value.lua)
-- KEYS[2] holder info of fencelock 0.3 and older (deleted with the lock: the info is in the
--         value now)
-- KEYS[3] waiters (zset: id -> expiry in server ms)
-- KEYS[4] wake list   KEYS[5] writer intent marker
-- ARGV[1] token      ARGV[2] hand-off window in ms (unused)   ARGV[3] wake element lifetime in ms
-- ARGV[4], ARGV[5] unused   ARGV[6] the writer's waiter id ('-': it did not wait)
-- returns 1 released (it was ours); 0 not ours (expired, or another holder has it)
-- Either way the writer's own intent marker and registration go (ARGV[6]): a server that
-- refused the writer while a majority granted it (it still held the last writer's key) kept
-- them, and the intent would stop every reader there until it expired.
-- #include waiting.lua
-- #include lock_value.lua
if ARGV[6] and ARGV[6] ~= '-' then
  if redis.call('GET', KEYS[5]) == ARGV[6] then redis.call('DEL', KEYS[5]) end
  redis.call('ZREM', KEYS[3], ARGV[6])
end
if not lock_held_by(redis.call('GET', KEYS[1]), ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('EXISTS', KEYS[3]) == 1 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  waiters_wake(KEYS[3], KEYS[4], now_ms, ARGV[3])
end
return 1
