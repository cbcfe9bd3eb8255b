-- lock_value: what a lock key holds; the loader puts this text in place of the script's
-- `-- #include lock_value.lua` line.
-- The value is the holder's token, then, when the holder gave any, byte 255 and its holder
-- info (host, pid, since: JSON), so that a held lock is one key. Byte 255 is in no UTF-8
-- text, so in no token (fencelock's are hex; the compat layer's are checked to be UTF-8).
-- Byte 254 (in no UTF-8 text either) in its place marks that a caller registered as a waiter
-- while this holder held the lock (acquire.lua sets it, and a grant to a waiter that leaves
-- others waiting): only then, or for a bare token, does release.lua look for waiters to wake,
-- so an uncontended release runs one command fewer.
-- A value of fencelock 0.3 and older is the bare token (its holder info in a key of its own);
-- so is a value written without holder info (the compat layer's: redis-py code reads it).
-- The empty value is the hand-off marker: a release that woke a waiter keeps the lock for it
-- for the hand-off window (always with a PX), and newcomers step aside; it is no token's
-- (a token is never empty), and it is UTF-8, as fencelock.compat's users read that key.
local function lock_value(token, info)
  if info == '' then return token end
  return token .. '\255' .. info
end
-- whether `value` (a GET of the lock key: false when there is none) is `token`'s
local function lock_held_by(value, token)
  if token == '' or value == false then return false end
  if value == token then return true end
  if string.sub(value, 1, #token) ~= token then return false end
  local after = string.byte(value, #token + 1)
  return after == 255 or after == 254
end
-- the token in `value` (a GET of the lock key, not false)
local function lock_token(value)
  local cut = string.find(value, '[\254\255]')
  if cut then return string.sub(value, 1, cut - 1) end
  return value
end
-- whether a release of `value` (a holder's, see lock_held_by) must look for waiters: a bare
-- token carries no mark, so it must
local function lock_may_have_waiters(value, token)
  return string.byte(value, #token + 1) ~= 255
end
-- `value` with the waiters' mark (unchanged when it is a bare token or marked already)
local function lock_marked(value)
  local cut = string.find(value, '\255', 1, true)
  if not cut then return value end
  return string.sub(value, 1, cut - 1) .. '\254' .. string.sub(value, cut + 1)
end
