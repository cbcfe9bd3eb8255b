-- sem_sweep: after a failed or split semaphore round, delete our token from whichever slot
-- it landed on (compare-and-delete per slot); wake one waiter if one was freed.
-- KEYS[1] waiters (zset: id -> expiry in server ms)    KEYS[2] wake list
-- KEYS[3 + 2i] slot i's lock key (value: see lock_value.lua)
-- KEYS[4 + 2i] slot i's holder info of fencelock 0.3 and older (deleted with the
--              slot's lock key)   (variadic: 2 per slot)
-- ARGV[1] token      ARGV[2] hand-off window in ms (unused)   ARGV[3] wake element lifetime in ms
-- returns 1 when a slot held our token (now deleted); 0 when none did: nothing changed
-- #include lock_value.lua
local freed = 0
local slots = (#KEYS - 2) / 2
for i = 0, slots - 1 do
  if lock_held_by(redis.call('GET', KEYS[3 + 2 * i]), ARGV[1]) then
    redis.call('DEL', KEYS[3 + 2 * i], KEYS[4 + 2 * i])
    freed = 1
  end
end
if freed == 1 and redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('DEL', KEYS[2])
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return freed
