-- tower-pinned-window: count several hits on several counters in one call,
-- exactly as if each hit had been sent alone with hit.lua.
-- KEYS[i]: counter i (a key may appear more than once, for hits with another
-- window: the entries are applied in order).
-- ARGV[2i-1]: how many hits counter i takes (n >= 1);
-- ARGV[2i]: its window in milliseconds, attached only when the counter has
-- no lifetime (it was just created), in the same atomic step.
-- Returns one reply per key, in order: {count, milliseconds left, deadline}
-- after all n hits (they got counts count-n+1 .. count), {reason} for a
-- corrupt counter (left as it was), or {0, error} when Redis refused the
-- command for another reason (nothing was written for that key).
local replies = {}
for i = 1, #KEYS do
  local key = KEYS[i]
  local n = tonumber(ARGV[2 * i - 1])
  local window = tonumber(ARGV[2 * i])
  if not n or n < 1 or n > 4294967295 or n % 1 ~= 0 then
    replies[i] = {0, 'ERR tower-pinned-window: invalid hit count ' .. tostring(ARGV[2 * i - 1])}
  elseif not window or window < 1 or window > 9007199254740991 or window % 1 ~= 0 then
    replies[i] = {0, 'ERR tower-pinned-window: invalid window ' .. tostring(ARGV[2 * i])}
  else
    local count = redis.pcall('INCRBY', key, n)
    if type(count) == 'table' then
      local err = count.err or ''
      if string.find(err, 'WRONGTYPE', 1, true) or string.find(err, 'not an integer', 1, true)
          or string.find(err, 'overflow', 1, true) then
        local kind = redis.call('TYPE', key).ok
        if kind == 'string' then
          replies[i] = {'value ' .. string.sub(redis.call('GET', key), 1, 64)}
        else
          replies[i] = {'a key of type ' .. kind}
        end
      else
        replies[i] = {0, err}
      end
    elseif count < n then
      -- The value was negative: put it back as it was.
      redis.call('DECRBY', key, n)
      replies[i] = {'negative value ' .. tostring(count - n)}
    else
      local ttl = redis.call('PTTL', key)
      if ttl < 0 then
        redis.call('PEXPIRE', key, window)
        ttl = window
      end
      local deadline = redis.pcall('PEXPIRETIME', key)
      if type(deadline) ~= 'number' then
        deadline = -1
      end
      replies[i] = {count, ttl, deadline}
    end
  end
end
return replies
