-- tower-pinned-window: take a slot of a key's requests in flight, in one
-- atomic step.
-- KEYS[1]: the record of the key's slots. ARGV[1]: the slot's name;
-- ARGV[2]: the cap's max; ARGV[3]: the lease in milliseconds.
-- The leases that ran out are dropped; a slot the key already holds is
-- granted again, changing nothing; else, with fewer than max live, the slot
-- is added with the lease `now + lease` and the record lives at least that
-- long (in the same step: the record is never left without a lifetime).
-- Returns {1, in use} when granted; {0, in use, ms until the earliest lease
-- runs out} when refused; {reason} for a record that is not one, left as
-- it is.
local slot, max, lease = ARGV[1], tonumber(ARGV[2]), millis(ARGV[3])
if not is_slot(slot) then
  return redis.error_reply('ERR tower-pinned-window: invalid slot ' .. tostring(slot))
end
if not max or max < 1 or max % 1 ~= 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid max ' .. tostring(ARGV[2]))
end
if not lease then
  return redis.error_reply('ERR tower-pinned-window: invalid lease ' .. tostring(ARGV[3]))
end
local record = KEYS[1]
local bad = not_slots(record)
if bad then
  return {bad}
end
local now = now_ms()
redis.call('ZREMRANGEBYSCORE', record, '-inf', int(now))
local held = redis.call('ZCARD', record)
if redis.call('ZSCORE', record, slot) then
  return {1, held}
end
if held < max then
  local ends = now + lease
  redis.call('ZADD', record, int(ends), slot)
  live_until(record, ends)
  return {1, held + 1}
end
local earliest = redis.call('ZRANGE', record, 0, 0, 'WITHSCORES')
return {0, held, tonumber(earliest[2]) - now}
