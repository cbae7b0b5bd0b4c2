-- tower-pinned-window: read a counter without counting.
-- Returns {} when absent, {reason} when corrupt, {value, PTTL} otherwise.
local kind = redis.call('TYPE', KEYS[1]).ok
if kind == 'none' then
  return {}
end
if kind ~= 'string' then
  return {'a key of type ' .. kind}
end
local value = redis.call('GET', KEYS[1])
if not string.match(value, '^%d+$') then
  return {'value ' .. string.sub(value, 1, 64)}
end
return {value, redis.call('PTTL', KEYS[1])}
