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
--   -2, 0, 0                a take's invalid arguments (nothing written
--                           for it; a give-back's name is not read, as in
--                           give_back.lua: a name no slot has is found
--                           nowhere)
-- then, for each step answered -1 or -2, its place (from 1) and why.
-- A refusal that is not about one record (READONLY, OOM) fails the call: it
-- comes at the call's first write, so nothing was written.
local now = now_ms()
-- The clock and each lease's end as text, written once a call: `%d` costs
-- Redis more than a command.
local now_text = nil
-- Per record, what this call knows of it, read once: only this script
-- writes to it during the call (`slots_of`).
local records = {}
-- The last take's spec, as sent and as numbers, and its lease's end (nil
-- after an invalid one).
local spec_arg, max, ends, ends_text = nil, nil, nil, nil
local packed = {}
local why = {}
local function answer(i, code, in_use, ms)
  packed[i] = struct.pack('>i8i8i8', code, in_use, ms)
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
      spec_arg, max, ends = spec, m, now + l
      ends_text = int(ends)
    else
      spec_arg, max, ends, ends_text = nil, nil, nil, nil
    end
  end
  if take and not is_slot(slot) then
    refuse(i, -2, 'ERR tower-pinned-window: invalid slot ' .. tostring(slot))
  elseif take and not spec_arg then
    refuse(i, -2, 'ERR tower-pinned-window: invalid take ' .. tostring(spec))
  else
    local r = records[record]
    if r == nil then
      r = slots_of(record)
      records[record] = r
    end
    if type(r) == 'string' then
      refuse(i, -1, r)
    elseif not take then
      -- As ZREM: a slot whose lease ran out but is still there is found.
      if r.names[slot] then
        redis.call('ZREM', record, slot)
        r.names[slot] = nil
        r.count = r.count - 1
        if r.count == 0 then
          -- Emptied: Redis deleted it, and its lifetime.
          r.lifetime, r.pruned = -1, true
        end
        answer(i, 1, 0, 0)
      else
        answer(i, 0, 0, 0)
      end
    else
      if not r.pruned then
        -- The leases that ran out are dropped, once a call (the clock is
        -- read once: none runs out after that).
        if r.count > 0 then
          now_text = now_text or int(now)
          if redis.call('ZCOUNT', record, '-inf', now_text) > 0 then
            redis.call('ZREMRANGEBYSCORE', record, '-inf', now_text)
            local left = slots_of(record)
            r.names, r.count = left.names, left.count
            r.lifetime = left.lifetime or r.lifetime
          end
        end
        r.pruned = true
      end
      if r.names[slot] then
        answer(i, 1, r.count, 0)
      elseif r.count < max then
        redis.call('ZADD', record, ends_text, slot)
        r.names[slot] = true
        r.count = r.count + 1
        -- The record lives at least as long as this lease, from this step.
        local lifetime = r.lifetime or redis.call('PEXPIRETIME', record)
        if lifetime < ends then
          redis.call('PEXPIREAT', record, ends_text)
          lifetime = ends
        end
        r.lifetime = lifetime
        answer(i, 1, r.count, 0)
      else
        local earliest = redis.call('ZRANGE', record, '0', '0', 'WITHSCORES')
        answer(i, 0, r.count, tonumber(earliest[2]) - now)
      end
    end
  end
end
local out = { table.concat(packed) }
for k = 1, #why do
  out[1 + k] = why[k]
end
return out
