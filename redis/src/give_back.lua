-- tower-pinned-window: give back a slot of a key's requests in flight.
-- KEYS[1]: the record of the key's slots. ARGV[1]: the slot's name.
-- Returns 1 when the slot was there (it is gone now), 0 when it was not,
-- {reason} for a record that is not one, left as it is. Never creates the
-- record nor touches its lifetime (an emptied record is deleted by Redis).
local bad = not_slots(KEYS[1])
if bad then
  return {bad}
end
return redis.call('ZREM', KEYS[1], ARGV[1])
