-- tower-pinned-window: change the counters hits were counted in, each only
-- in its hit's window (refund, charge or clear). The amends of one call are
-- applied in order, each exactly as if it had been its own call.
-- Per amend, in order:
--   KEYS: the counter, then its reset marker;
--   ARGV: 'refund', 'charge' or 'clear'; how much (refund, charge); the
--         hit's deadline (the counter's PEXPIRETIME at the hit, Unix ms).
-- A window is named by its deadline and by the reset marker: a reset (or a
-- clear) that deletes a window leaves a marker that lives until that
-- window's deadline. A window opened after it with the same deadline (in
-- the same millisecond as the deleted one was) cannot be told from it by
-- its hits, so no hit of that deadline is amended while the marker lives:
-- never the wrong window, at the price of the new window's own amends.
-- Returns {answers, reason, reason, ...}: one string of a signed byte per
-- amend, in order (one value for the client to read, however many amends):
--   1 when the counter changed;
--   0 when there was nothing to change (no counter, the window closed,
--     another window, a count of zero, an amount of zero);
--   -1 for a corrupt counter, left as it is;
--   -2 for invalid arguments (nothing written);
-- then the reason of each amend answered -1 or -2, in order.
-- Never creates a key, never sets or changes a counter's lifetime (INCRBY,
-- DECRBY keep it).
local out = {}
local function amend(counter, marker, op, amount_sent, deadline_sent)
  local amount, deadline = tonumber(amount_sent), tonumber(deadline_sent)
  if (op ~= 'refund' and op ~= 'charge' and op ~= 'clear') or not amount or amount < 0
      or amount % 1 ~= 0 or not string.find(amount_sent, '^%d+$') then
    return -2, 'ERR tower-pinned-window: invalid amend ' .. tostring(op) .. ' ' .. tostring(amount_sent)
  end
  if not deadline or deadline < 1 or deadline % 1 ~= 0 then
    return -2, 'ERR tower-pinned-window: invalid deadline ' .. tostring(deadline_sent)
  end
  -- -2 for a missing (or expired) key, -1 for one without a lifetime, and
  -- another time for another window: only the hit's own window is touched.
  if redis.call('PEXPIRETIME', counter) ~= deadline then
    return 0, ''
  end
  if redis.call('PEXPIRETIME', marker) == deadline then
    -- A window of this deadline was deleted: the hit may be its.
    return 0, ''
  end
  local kind = redis.call('TYPE', counter).ok
  if kind ~= 'string' then
    return -1, 'a key of type ' .. kind
  end
  local value = redis.call('GET', counter)
  if not string.match(value, '^%d+$') then
    return -1, 'value ' .. string.sub(value, 1, 64)
  end
  if op == 'clear' then
    redis.call('SET', marker, '1', 'PXAT', deadline)
    redis.call('DEL', counter)
    return 1, ''
  end
  if amount == 0 then
    return 0, ''
  end
  if op == 'charge' then
    if type(redis.pcall('INCRBY', counter, amount_sent)) == 'table' then
      return -1, 'value ' .. string.sub(value, 1, 64) .. ' (a charge of ' .. amount_sent .. ' overflows)'
    end
    return 1, ''
  end
  if value == '0' then
    return 0, ''
  end
  -- Never below zero. DECRBY refuses what INCR would refuse (leading zeros,
  -- past 64 bits), and then changes nothing.
  local take = amount_sent
  if amount >= tonumber(value) then
    take = value
  end
  if type(redis.pcall('DECRBY', counter, take)) == 'table' then
    return -1, 'value ' .. string.sub(value, 1, 64)
  end
  return 1, ''
end
if #KEYS % 2 ~= 0 or #ARGV ~= 3 * #KEYS / 2 then
  return redis.error_reply('ERR tower-pinned-window: invalid amend batch')
end
local codes = {}
for i = 1, #KEYS / 2 do
  local code, detail = amend(KEYS[2 * i - 1], KEYS[2 * i], ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i])
  codes[i] = string.char(code % 256)
  if code < 0 then
    out[#out + 1] = detail
  end
end
table.insert(out, 1, table.concat(codes))
return out
