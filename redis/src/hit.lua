-- tower-pinned-window: count one hit in a window pinned to the first hit.
-- KEYS[1]: the counter. ARGV[1]: the window in milliseconds.
-- Returns {count, milliseconds left, deadline}, where the deadline is the
-- counter's absolute expiry in Unix milliseconds (PEXPIRETIME, Redis 7.0;
-- -1 on older servers), or {reason} for a corrupt counter.
local window = tonumber(ARGV[1])
if not window or window < 1 or window > 9007199254740991 or window % 1 ~= 0 then
  return redis.error_reply('ERR tower-pinned-window: invalid window ' .. tostring(ARGV[1]))
end
local count = redis.pcall('INCR', KEYS[1])
if type(count) == 'table' then
  local err = count.err or ''
  if string.find(err, 'WRONGTYPE', 1, true) or string.find(err, 'not an integer', 1, true)
      or string.find(err, 'overflow', 1, true) then
    local kind = redis.call('TYPE', KEYS[1]).ok
    if kind == 'string' then
      return {'value ' .. string.sub(redis.call('GET', KEYS[1]), 1, 64)}
    end
    return {'a key of type ' .. kind}
  end
  return redis.error_reply(err)
end
if count < 1 then
  redis.call('DECR', KEYS[1])
  return {'negative value ' .. tostring(count - 1)}
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 0 then
  redis.call('PEXPIRE', KEYS[1], window)
  ttl = window
end
local deadline = redis.pcall('PEXPIRETIME', KEYS[1])
if type(deadline) ~= 'number' then
  deadline = -1
end
return {count, ttl, deadline}
