-- extend: compare-and-pexpire; the lease restarts at ARGV[2] ms from now.
-- KEYS[1] lock key (value: see lock_value.lua; the holder info is in it, so this one key is
--         the whole lease: no absent key beside it makes a cluster node answer TRYAGAIN while
--         the slot migrates)
-- ARGV[1] token      ARGV[2] new lease in ms
-- KEYS[2], ARGV[3] (optional, together; the script is variadic in that sense) the fence
--         register and the fence of the grant this extend is for: a token that is granted
--         again (the compat layer's, chosen by the caller) is ours only while the register
--         holds that grant's fence (or nothing: gone after its retention), not after the same
--         token's next grant
-- returns 1 extended (it was ours); 0 not ours: nothing changed
local value = redis.call('GET', KEYS[1])
local after = value and string.byte(value, #ARGV[1] + 1)
-- (lock_value.lua's lock_held_by for its common cases, our token with holder info or bare,
-- written out so that they build no Lua function, which is built on every call)
if not (value and ARGV[1] ~= '' and string.sub(value, 1, #ARGV[1]) == ARGV[1]
    and (after == 255 or after == nil)) then
-- #include lock_value.lua
  if not lock_held_by(value, ARGV[1]) then return 0 end
end
if ARGV[3] then
  local fence = redis.call('GET', KEYS[2])
  if fence and fence ~= ARGV[3] then return 0 end
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return 1
