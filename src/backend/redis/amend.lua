-- tower-pinned-window: change the counter a hit was counted in, only in
-- that window (refund, charge or clear).
-- KEYS[1]: the counter; KEYS[2]: its reset marker.
-- ARGV[1]: 'refund', 'charge' or 'clear'; ARGV[2]: how much (refund, charge);
-- ARGV[3]: the hit's deadline (the counter's PEXPIRETIME at the hit, Unix ms);
-- ARGV[4]: the hit's instant on the server's clock (Unix microseconds).
-- A window is named by its deadline and, when a window of the same deadline
-- was deleted (reset, clear), by the hit's instant: the reset marker holds
-- the instant of the last deletion and lives until the deleted window's
-- deadline, so a hit at or before it belongs to a deleted window.
-- Returns 1 when the counter changed; 0 when there was nothing to change (no
-- counter, the window closed, another window, a count of zero, an amount of
-- zero); {reason} for a corrupt counter, left as it is. Never creates a key,
-- never sets or changes a counter's lifetime (INCRBY, DECRBY keep it).
local op, amount = ARGV[1], tonumber(ARGV[2])
local deadline, instant = tonumber(ARGV[3]), tonumber(ARGV[4])
if (op ~= 'refund' and op ~= 'charge' and op ~= 'clear') or not amount or amount < 0
    or amount % 1 ~= 0 or not string.find(ARGV[2], '^%d+$') then
  return redis.error_reply('ERR tower-pinned-window: invalid amend ' .. tostring(op) .. ' ' .. tostring(ARGV[2]))
end
if not deadline or deadline < 1 or deadline % 1 ~= 0 or not instant or instant < 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid deadline ' .. tostring(ARGV[3]))
end
-- -2 for a missing (or expired) key, -1 for one without a lifetime, and
-- another time for another window: only the hit's own window is touched.
if redis.call('PEXPIRETIME', KEYS[1]) ~= deadline then
  return 0
end
if redis.call('PEXPIRETIME', KEYS[2]) == deadline then
  local deleted = tonumber(redis.call('GET', KEYS[2]))
  if deleted and instant <= deleted then
    -- The hit's window was deleted; this one opened after, in the same ms.
    return 0
  end
end
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'string' then
  return {'a key of type ' .. kind}
end
local value = redis.call('GET', KEYS[1])
if not string.match(value, '^%d+$') then
  return {'value ' .. string.sub(value, 1, 64)}
end
if op == 'clear' then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  redis.call('SET', KEYS[2], string.format('%d', now), 'PXAT', deadline)
  redis.call('DEL', KEYS[1])
  return 1
end
if amount == 0 then
  return 0
end
if op == 'charge' then
  if type(redis.pcall('INCRBY', KEYS[1], ARGV[2])) == 'table' then
    return {'value ' .. string.sub(value, 1, 64) .. ' (a charge of ' .. ARGV[2] .. ' overflows)'}
  end
  return 1
end
if value == '0' then
  return 0
end
-- Never below zero. DECRBY refuses what INCR would refuse (leading zeros,
-- past 64 bits), and then changes nothing.
local count = tonumber(value)
local take = ARGV[2]
if amount >= count then
  take = value
end
if type(redis.pcall('DECRBY', KEYS[1], take)) == 'table' then
  return {'value ' .. string.sub(value, 1, 64)}
end
return 1
