-- tower-pinned-window: delete a counter and its lockout.
-- KEYS[1]: the counter; KEYS[2]: its lockout; KEYS[3]: its reset marker.
-- When the counter has a deadline (PEXPIRETIME, Redis 7.0), the reset
-- marker records this instant (TIME, Unix microseconds) until that
-- deadline: a window opened later in the same millisecond has the same
-- deadline, and the marker tells the deleted window's hits from its own.
-- Returns how many of the counter and the lockout existed.
local deadline = redis.pcall('PEXPIRETIME', KEYS[1])
if type(deadline) == 'number' and deadline > 0 then
  local time = redis.call('TIME')
  local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  redis.call('SET', KEYS[3], string.format('%d', now), 'PXAT', deadline)
end
return redis.call('DEL', KEYS[1], KEYS[2])
