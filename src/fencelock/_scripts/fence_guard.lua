-- fence_guard: the check every storage guard (fence_write, fence_advance, fence_apply) makes
-- before it changes the resource's hash, and the token it leaves beside an accepted fence
-- (the loader puts this text in place of the script's `-- #include fence_guard.lua` line).
-- Fences are compared as decimal strings (length first), so they stay exact above 2^53. An
-- equal fence is accepted only with the token stored beside it ('' = no token on both sides).
local function older(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
-- {0, current} when the hash's fence is newer than `offered`, {4, current} when it equals it
-- but was accepted with another token; else nil, then the hash's fence (nil: none) and token
-- ('' = none). Reads only: a refusal changes nothing.
local function fence_check(key, offered, token)
  local current = redis.call('HGET', key, 'fence')
  local holder = ''
  if current then
    if older(offered, current) then
      return {0, current}
    end
    holder = redis.call('HGET', key, 'token') or ''
    if offered == current and holder ~= token then
      return {4, current}
    end
  end
  return nil, current, holder
end
-- the accepted fence's token: `token`, or none when it is '' (the one before, `holder`, dropped)
local function fence_stamp(key, token, holder)
  if token ~= '' then
    redis.call('HSET', key, 'token', token)
  elseif holder ~= '' then
    redis.call('HDEL', key, 'token')
  end
end
