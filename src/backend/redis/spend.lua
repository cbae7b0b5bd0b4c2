-- tower-pinned-window: a spend on every counter of one request, all or
-- nothing (see the backend contract, "Costs, lockouts and amends").
-- KEYS[2i-1]: counter i; KEYS[2i]: its lockout marker.
-- ARGV[1]: the cost; ARGV[2]: '1' to open a missing counter at a cost of 0;
-- ARGV[3]: the lockout in milliseconds, '0' for none;
-- ARGV[2+2i]: counter i's limit; ARGV[3+2i]: its window in milliseconds.
-- Returns {1 admitted or 0 denied, then per counter: count, milliseconds
-- left, deadline (-1 when nothing was counted)}, or {-1, i, reason} when
-- counter i is corrupt (nothing written). Needs PEXPIRETIME (Redis 7.0).
local function whole(sent, max)
  local n = tonumber(sent)
  if n and n >= 0 and n <= max and n % 1 == 0 and string.find(sent, '^%d+$') then
    return n
  end
  return nil
end
local big = 9007199254740991
local cost = whole(ARGV[1], 18446744073709551615)
local block = whole(ARGV[3], big)
if not cost or not block or #KEYS % 2 ~= 0 or #ARGV ~= 3 + #KEYS then
  return redis.error_reply('ERR tower-pinned-window: invalid spend')
end
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now = math.floor(now_us / 1000)
local step = math.max(cost, 1)
local n = #KEYS / 2
local counters = {}
local admitted = true
for i = 1, n do
  local key, lock = KEYS[2 * i - 1], KEYS[2 * i]
  local limit = whole(ARGV[2 + 2 * i], 18446744073709551615)
  local window = whole(ARGV[3 + 2 * i], big)
  if not limit or not window or window < 1 then
    return redis.error_reply('ERR tower-pinned-window: invalid limit or window')
  end
  local kind = redis.call('TYPE', key).ok
  local count = 0
  if kind == 'string' then
    local value = redis.call('GET', key)
    if not string.find(value, '^%d+$') or (#value > 1 and string.sub(value, 1, 1) == '0') or #value > 19 then
      return {-1, i, 'value ' .. string.sub(value, 1, 64)}
    end
    count = tonumber(value)
  elseif kind ~= 'none' then
    return {-1, i, 'a key of type ' .. kind}
  end
  local locked = redis.call('PTTL', lock)
  if locked == -1 then
    return {-1, i, 'a lockout without a lifetime'}
  end
  local c = {key = key, lock = lock, limit = limit, window = window, count = count,
    exists = kind ~= 'none', locked = locked}
  c.fits = locked == -2 and count + step <= limit
  admitted = admitted and c.fits
  counters[i] = c
end
local out = {admitted and 1 or 0}
for i = 1, n do
  local c = counters[i]
  local count, left, deadline = c.count, 0, -1
  local expiry = -2
  if c.exists then
    expiry = redis.call('PEXPIRETIME', c.key)
    if expiry == -1 then
      -- No lifetime (left so by older code): its window starts now.
      expiry = now + c.window
      redis.call('PEXPIREAT', c.key, string.format('%d', expiry))
    end
  end
  if admitted then
    if cost > 0 or c.exists or ARGV[2] == '1' then
      if cost > 0 then
        count = redis.call('INCRBY', c.key, ARGV[1])
      elseif not c.exists then
        redis.call('SET', c.key, '0')
      end
      if not c.exists then
        expiry = now + c.window
        redis.call('PEXPIREAT', c.key, string.format('%d', expiry))
      end
      deadline = expiry
      left = math.max(expiry - now, 0)
    end
  else
    if c.fits then
      if expiry > 0 then
        left = math.max(expiry - now, 0)
      end
    else
      count = math.max(count + step, c.limit + 1)
      if c.locked == -2 and block > 0 then
        redis.call('SET', c.lock, string.format('%d', now), 'PX', block)
        c.locked = block
      end
      if c.locked >= 0 then
        left = c.locked
      elseif expiry > 0 then
        left = math.max(expiry - now, 0)
      else
        left = c.window
      end
    end
  end
  out[3 * i - 1] = count
  out[3 * i] = left
  out[3 * i + 1] = deadline
end
return out
