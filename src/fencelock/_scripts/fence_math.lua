-- fence_math: exact fence arithmetic, included by every script that issues or commits a fence
-- (the loader puts this text in place of the script's `-- #include fence_math.lua` line).
-- A Lua number is a double: past 2^53 it cannot tell F from F + 1, and a script returning one
-- hands the client a rounded integer. So a fence is a decimal string here, end to end: '0' or
-- digits without a leading zero, at most FENCE_MAX = 2^63 - 1 (it always fits a signed 64-bit
-- integer, a SQL BIGINT); compared by length, then as text; incremented by carrying digits.
local FENCE_MAX = '9223372036854775807'
local function fence_less(a, b)
  if #a ~= #b then return #a < #b end
  return a < b
end
-- the register `key`'s value `text` (false: absent, '0') as a fence, or nil and why it is not one
local function fence_parse(key, text)
  if not text then return '0' end
  local digits = string.match(text, '^0*(%d+)$')
  if not digits or fence_less(FENCE_MAX, digits) then
    return nil, 'ERR fence register ' .. key .. ' holds ' .. string.sub(text, 1, 40)
      .. ', not a fence (a decimal integer from 0 to 2^63 - 1)'
  end
  return digits
end
-- F's value ('0' when the register is absent), or nil and why it is not a fence
local function fence_read(key)
  return fence_parse(key, redis.call('GET', key))
end
-- the server's TIME in microseconds, exactly (its seconds, then its microseconds as 6 digits)
local function fence_time(now)
  return now[1] .. string.sub('00000' .. now[2], -6)
end
-- TIME rounded up to a multiple of `step` us (a divisor of 1,000,000 from 2 up; anything else:
-- TIME itself), in the shape TIME has. Servers whose clocks agree within the step, granting
-- over the same F, then issue the same fence, so an N-server grant whose majority returned one
-- value needs no fence commit (_core/fencing.py)
local function fence_step_up(now, step)
  step = tonumber(step or '0') or 0
  if step < 2 or step > 1000000 or 1000000 % step ~= 0 then return now end
  local us = math.ceil(tonumber(now[2]) / step) * step
  if us < 1000000 then return {now[1], string.format('%d', us)} end
  return {string.format('%d', tonumber(now[1]) + 1), '0'}
end
-- the fence a grant stores and returns: max(F + 1, floor), for `floor` the TIME floor (see
-- fence_issue); or nil and why (F is not a fence, or F is FENCE_MAX: no larger fence exists,
-- so none is issued rather than a repeat). F below the floor, the common case, gives the floor
local function fence_above(key, f, floor)
  if f == FENCE_MAX then
    return nil, 'ERR fence register ' .. key .. ' is at 2^63 - 1: no larger fence can be issued'
  end
  if fence_less(f, floor) then return floor end  -- F + 1 <= floor
  local i = #f
  while i > 0 and string.byte(f, i) == 57 do i = i - 1 end  -- trailing 9s carry
  if i == 0 then return '1' .. string.rep('0', #f) end
  return string.sub(f, 1, i - 1) .. string.char(string.byte(f, i) + 1) .. string.rep('0', #f - i)
end
-- F = fence, kept for `retention` ms after this write ('0' or nil: for ever), but only while
-- the fence is at most half of that ahead of this server's clock (`now`: TIME, or nil to read
-- it). The register is gone only once the same clock passed this write by the retention, so
-- the TIME floor alone then issues a larger fence than any this register held, unless the
-- clock stepped back by half the retention. A fence further ahead (a register raised by hand,
-- or from a server whose clock runs ahead) is kept for ever: its expiry could let fences go
-- back.
-- (the SET options that keep it so: {'PX', ms} or none)
local function fence_keep(fence, now, retention)
  local ms = tonumber(retention or '0') or 0
  if ms >= 1 then
    now = now or redis.call('TIME')
    local reach = string.format('%.0f', tonumber(now[1]) * 1000000 + tonumber(now[2]) + ms * 500)
    if not fence_less(reach, fence) then return {'PX', string.format('%d', ms)} end
  end
  return {}
end
local function fence_store(key, fence, now, retention)
  redis.call('SET', key, fence, unpack(fence_keep(fence, now, retention)))
end
-- What fence_issue's SET `key` `floor` GET (with fence_keep's options), answered `old`, grants:
-- the fence, stored as fence_store does; or nil and why, the register put back as it was (its
-- TTL dropped, though). A server without SET ... GET (Redis before 6.2) refuses it, and so does
-- a register that holds no string: then it is read and written as two commands (or, for a key
-- of another type, the reason is returned: a script's caller can still undo what it took).
local function fence_settle(key, now, retention, floor, old)
  local written = type(old) ~= 'table'  -- (an error reply: nothing was written)
  if not written then
    old = redis.pcall('GET', key)
    if type(old) == 'table' then
      return nil, 'ERR fence register ' .. key .. ' is not a string, so not a fence'
        .. ' (a decimal integer from 0 to 2^63 - 1)'
    end
  end
  local fence, why = fence_parse(key, old)
  if fence then fence, why = fence_above(key, fence, floor) end
  if not fence then
    -- no fence, or 2^63 - 1: put back what was there (a register that far ahead has no TTL,
    -- see fence_store; one that is no fence loses its TTL)
    if written then redis.call('SET', key, old) end
    return nil, why
  end
  if fence ~= floor or not written then fence_store(key, fence, now, retention) end
  return fence
end
-- The fence a grant issues (fence_above the register, over the TIME floor: TIME stepped up by
-- `step`), stored in the register `key` as fence_store does; or nil and why, the register left
-- as it was (its TTL dropped, though: see fence_settle). When the TIME floor is the fence,
-- which it is unless the register is at or past it, that is one command, SET ... GET (the
-- register read as it is replaced); otherwise the register is written again.
local function fence_issue(key, now, step, retention)
  local floor = fence_time(fence_step_up(now, step))
  local old = redis.pcall('SET', key, floor, 'GET', unpack(fence_keep(floor, now, retention)))
  return fence_settle(key, now, retention, floor, old)
end
-- F = max(F, fence) for a fence the client sends (a commit; stored as fence_store does); the
-- register before, or nil and why when either is not a fence
local function fence_raise(key, fence, retention)
  local f, why = fence_read(key)
  if not f then return nil, why end
  if not string.match(fence, '^[1-9]%d*$') or fence_less(FENCE_MAX, fence) then
    return nil, 'ERR not a fence: ' .. string.sub(fence, 1, 40)
  end
  if fence_less(f, fence) then fence_store(key, fence, nil, retention) end
  return f
end
