-- lock_value: what a lock key holds; the loader puts this text in place of the script's
-- `-- #include lock_value.lua` line.
-- The value is the holder's token, then, when the holder gave any, byte 255 and its holder
-- info (host, pid, since: JSON), so that a held lock is one key. Byte 255 is in no UTF-8
-- text, so in no token (fencelock's are hex; the compat layer's are checked to be UTF-8).
-- A value of fencelock 0.3 and older is the bare token (its holder info in a key of its own).
-- The empty value is the hand-off marker: a release that woke a waiter keeps the lock for it
-- for the hand-off window (always with a PX), and newcomers step aside; it is no token's
-- (a token is never empty), and it is UTF-8, as fencelock.compat's users read that key.
local function lock_value(token, info)
  if info == '' then return token end
  return token .. '\255' .. info
end
-- whether `value` (a GET of the lock key: false when there is none) is `token`'s
local function lock_held_by(value, token)
  if value == token then return token ~= '' end
  return value ~= false and string.sub(value, 1, #token + 1) == token .. '\255'
end
-- the token in `value` (a GET of the lock key, not false)
local function lock_token(value)
  local cut = string.find(value, '\255', 1, true)
  if cut then return string.sub(value, 1, cut - 1) end
  return value
end
