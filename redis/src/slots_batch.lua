-- tower-pinned-window: takes and give-backs of slots in flight, of one or
-- more keys, in one call: each step exactly as take.lua or give_back.lua
-- would make it alone, in the order sent (a record may be named by many).
-- KEYS[i]: the record of step i's key.
-- ARGV[2i-1]: step i's slot name;
-- ARGV[2i]: what step i does: '-' gives the slot back; 'max lease' (the
-- cap's max, a space, the lease in milliseconds) takes it.
-- A take drops the record's leases that ran out; a slot the record already
-- holds is granted again, changing nothing; else, with fewer than max
-- live, the slot is added with the lease `now + lease` and the record lives
-- at least that long (in the same step: the record is never left without a
-- lifetime). A give-back removes the slot; it never creates a record nor
-- touches its lifetime. A record that is not one is left as it is, and
-- only its own steps are refused; the other steps of the call are made.
-- Returns {answers, i, reason, i, reason, ...}: one string of three signed
-- 64-bit big-endian integers per step, in order (one value for the client
-- to read, however many steps):
--   1, in use, 0            a take granted (in use after it)
--   0, in use, ms           a take refused: in use, and the ms until the
--                           earliest live lease runs out
--   1, 0, 0 / 0, 0, 0       a give-back: the slot was there / was not
--   -1, 0, 0                a record that is not one, left as it is
--   -2, 0, 0                invalid arguments (nothing written for it)
-- then, for each step answered -1 or -2, its place (from 1) and why.
-- A refusal that is not about one record (READONLY, OOM) fails the call: it
-- comes at the call's first write, so nothing was written.
local now = now_ms()
-- Per record: why it is not one (false when it is one), read once a call:
-- no step of this script makes a record corrupt.
local bad = {}
-- Records this call found missing and has not written since: a take there
-- creates the record (nothing to drop, nothing held, no lifetime yet), a
-- give-back finds nothing.
local absent = {}
-- Records whose leases that ran out were dropped this call (the clock is
-- read once: none runs out after that).
local pruned = {}
-- The last take's spec, as sent and as numbers (nil after an invalid one).
local spec_arg, max, lease = nil, nil, nil
local nums = {}
local why = {}
local function answer(i, code, in_use, ms)
  nums[3 * i - 2] = code
  nums[3 * i - 1] = in_use
  nums[3 * i] = ms
end
local function refuse(i, code, reason)
  answer(i, code, 0, 0)
  why[#why + 1] = i
  why[#why + 1] = reason
end
for i = 1, #KEYS do
  local record = KEYS[i]
  local slot = ARGV[2 * i - 1]
  local spec = ARGV[2 * i]
  local take = spec ~= '-'
  if take and spec ~= spec_arg then
    local m, l = string.match(spec or '', '^(%d+) (%d+)$')
    m, l = tonumber(m), millis(l)
    if m and m >= 1 and l then
      spec_arg, max, lease = spec, m, l
    else
      spec_arg, max, lease = nil, nil, nil
    end
  end
  if not is_slot(slot) then
    refuse(i, -2, 'ERR tower-pinned-window: invalid slot ' .. tostring(slot))
  elseif take and not spec_arg then
    refuse(i, -2, 'ERR tower-pinned-window: invalid take ' .. tostring(spec))
  else
    local reason = bad[record]
    if reason == nil then
      local kind
      reason, kind = not_slots(record)
      reason = reason or false
      bad[record] = reason
      absent[record] = kind == 'none'
    end
    if reason then
      refuse(i, -1, reason)
    elseif not take then
      if absent[record] then
        answer(i, 0, 0, 0)
      else
        answer(i, redis.call('ZREM', record, slot), 0, 0)
      end
    elseif absent[record] then
      -- A new record: the slot, and the record's lifetime, in this step.
      local ends = now + lease
      redis.call('ZADD', record, int(ends), slot)
      redis.call('PEXPIREAT', record, int(ends))
      absent[record] = false
      pruned[record] = true
      answer(i, 1, 1, 0)
    else
      if not pruned[record] then
        redis.call('ZREMRANGEBYSCORE', record, '-inf', int(now))
        pruned[record] = true
      end
      local held = redis.call('ZCARD', record)
      if redis.call('ZSCORE', record, slot) then
        answer(i, 1, held, 0)
      elseif held < max then
        local ends = now + lease
        redis.call('ZADD', record, int(ends), slot)
        live_until(record, ends)
        answer(i, 1, held + 1, 0)
      else
        local earliest = redis.call('ZRANGE', record, 0, 0, 'WITHSCORES')
        answer(i, 0, held, tonumber(earliest[2]) - now)
      end
    end
  end
end
-- Packed 255 steps at a time: unpack puts each number on Lua's stack.
local parts = {}
for at = 1, #nums, 765 do
  local last = math.min(at + 764, #nums)
  parts[#parts + 1] = struct.pack('>' .. string.rep('i8', last - at + 1), unpack(nums, at, last))
end
local out = { table.concat(parts) }
for k = 1, #why do
  out[1 + k] = why[k]
end
return out
