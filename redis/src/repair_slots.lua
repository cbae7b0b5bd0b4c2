-- tower-pinned-window: attach a lifetime to a record of slots in flight
-- that has none (the audit's repair).
-- KEYS[1]: the record. ARGV[1]: the repair window in milliseconds.
-- The lifetime ends at the later of now + the window and the record's
-- latest lease, so no live slot is lost with it.
-- Returns 1 when it attached one, 0 when the record had a lifetime (or is
-- gone), -1 when the key is not a record of slots (never given a lifetime:
-- corrupt state must not vanish).
local window = millis(ARGV[1])
if not window then
  return redis.error_reply('ERR tower-pinned-window: invalid window ' .. tostring(ARGV[1]))
end
if not_slots(KEYS[1]) then
  return -1
end
if redis.call('PTTL', KEYS[1]) ~= -1 then
  return 0
end
local at = now_ms() + window
local latest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if latest[2] and tonumber(latest[2]) > at then
  at = tonumber(latest[2])
end
redis.call('PEXPIREAT', KEYS[1], int(at))
return 1
