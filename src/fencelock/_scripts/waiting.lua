-- waiting: the waiter queue every lock script shares (a zset: waiter id -> expiry in server ms,
-- and a wake list a release fills); the loader puts this text in place of the script's
-- `-- #include waiting.lua` line.
-- how long (ms) a refused caller that will wait (patience_ms > 0) stays a waiter: until the
-- holder's lease ends plus 1 s (pttl; the caller's lease_ms when pttl is not > 0), at most
-- its remaining wait plus 100 ms
local function waiter_hint(pttl, lease_ms, patience_ms)
  local hint = tonumber(lease_ms)
  if pttl > 0 then hint = pttl + 1000 end
  return math.min(hint, patience_ms + 100)
end
-- register waiter `id` in `waiters` for `hint` ms from now_ms; the zset lives at least as long
local function waiter_enlist(waiters, id, now_ms, hint)
  redis.call('ZADD', waiters, now_ms + hint, id)
  if redis.call('PTTL', waiters) < hint then redis.call('PEXPIRE', waiters, hint) end
end
-- wake every waiter still registered (up to 64): that many elements in the wake list, each
-- kept `lifetime` ms
local function waiters_wake(waiters, wake, now_ms, lifetime)
  redis.call('ZREMRANGEBYSCORE', waiters, '-inf', now_ms)
  local waiting = math.min(redis.call('ZCARD', waiters), 64)
  if waiting > 0 then
    redis.call('DEL', wake)
    for _ = 1, waiting do redis.call('RPUSH', wake, '1') end
    redis.call('PEXPIRE', wake, lifetime)
  end
end
-- whether `token` is a live reader in the zset `readers` (token -> expiry in server ms)
local function reader_live(readers, token, now_ms)
  local expiry = redis.call('ZSCORE', readers, token)
  return expiry and tonumber(expiry) > now_ms
end
