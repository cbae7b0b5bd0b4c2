-- tower-pinned-window: take back one hit, in the window it was counted in.
-- KEYS[1]: the counter. ARGV[1]: the deadline the hit reported (PEXPIRETIME
-- at the hit, absolute Unix milliseconds).
-- Returns 1 when the count went down by one; 0 when there was nothing to
-- take back (no counter, the window closed, a new window, a count of zero);
-- {reason} for a corrupt counter, left as it is. Never creates a key, never
-- sets or changes a lifetime (DECR keeps the key's expiry).
local deadline = tonumber(ARGV[1])
if not deadline or deadline < 1 or deadline % 1 ~= 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid deadline ' .. tostring(ARGV[1]))
end
-- -2 for a missing (or expired) key, -1 for one without a lifetime, and
-- another time for another window: only the hit's own window is touched.
if redis.call('PEXPIRETIME', KEYS[1]) ~= deadline then
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
if value == '0' then
  return 0
end
-- DECR refuses what INCR would refuse (leading zeros, past 64 bits), and
-- then changes nothing.
if type(redis.pcall('DECR', KEYS[1])) == 'table' then
  return {'value ' .. string.sub(value, 1, 64)}
end
return 1
