-- tower-pinned-window: delete a counter and its lockout.
-- KEYS[1]: the counter; KEYS[2]: its lockout; KEYS[3]: its reset marker.
-- When the counter has a deadline (PEXPIRETIME, Redis 7.0), the reset
-- marker lives until that deadline: a window opened later with the same
-- deadline (in the same millisecond as the deleted one was) is then never
-- amended for a hit of the deleted one (see amend.lua).
-- Returns how many of the counter and the lockout existed.
local deadline = redis.pcall('PEXPIRETIME', KEYS[1])
if type(deadline) == 'number' and deadline > 0 then
  redis.call('SET', KEYS[3], '1', 'PXAT', deadline)
end
return redis.call('DEL', KEYS[1], KEYS[2])
