-- tower-pinned-window: change the counter a hit was counted in, only in
-- that window (refund, charge or clear).
-- KEYS[1]: the counter; KEYS[2]: its reset marker.
-- ARGV[1]: 'refund', 'charge' or 'clear'; ARGV[2]: how much (refund, charge);
-- ARGV[3]: the hit's deadline (the counter's PEXPIRETIME at the hit, Unix ms).
-- A window is named by its deadline and by the reset marker: a reset (or a
-- clear) that deletes a window leaves a marker that lives until that
-- window's deadline. A window opened after it with the same deadline (in
-- the same millisecond as the deleted one was) cannot be told from it by
-- its hits, so no hit of that deadline is amended while the marker lives:
-- never the wrong window, at the price of the new window's own amends.
-- Returns 1 when the counter changed; 0 when there was nothing to change (no
-- counter, the window closed, another window, a count of zero, an amount of
-- zero); {reason} for a corrupt counter, left as it is. Never creates a key,
-- never sets or changes a counter's lifetime (INCRBY, DECRBY keep it).
local op, amount = ARGV[1], tonumber(ARGV[2])
local deadline = tonumber(ARGV[3])
if (op ~= 'refund' and op ~= 'charge' and op ~= 'clear') or not amount or amount < 0
    or amount % 1 ~= 0 or not string.find(ARGV[2], '^%d+$') then
  return redis.error_reply('ERR tower-pinned-window: invalid amend ' .. tostring(op) .. ' ' .. tostring(ARGV[2]))
end
if not deadline or deadline < 1 or deadline % 1 ~= 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid deadline ' .. tostring(ARGV[3]))
end
-- -2 for a missing (or expired) key, -1 for one without a lifetime, and
-- another time for another window: only the hit's own window is touched.
if redis.call('PEXPIRETIME', KEYS[1]) ~= deadline then
  return 0
end
if redis.call('PEXPIRETIME', KEYS[2]) == deadline then
  -- A window of this deadline was deleted: the hit may be its.
  return 0
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
  redis.call('SET', KEYS[2], '1', 'PXAT', deadline)
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
