-- tower-pinned-window: count the live slots of a key, changing nothing.
-- KEYS[1]: the record of the key's slots.
-- Returns the slots whose lease ends after now, or {reason} for a record
-- that is not one.
local bad = not_slots(KEYS[1])
if bad then
  return {bad}
end
return redis.call('ZCOUNT', KEYS[1], '(' .. int(now_ms()), '+inf')
