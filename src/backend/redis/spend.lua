-- tower-pinned-window: the spends of one or more requests, in order, each
-- all or nothing over its own counters (see the backend contract, "Costs,
-- lockouts and amends"). A call of several requests changes nothing about
-- each one: a request sees the counters as the requests before it in the
-- call left them, exactly as if each had been its own call.
-- Per request, in order:
--   KEYS: counter i, then its lockout marker, for each of its n counters;
--   ARGV: n; the cost; '1' to open a missing counter at a cost of 0; the
--         lockout in milliseconds, '0' for none; then counter i's limit and
--         window in milliseconds, for each counter.
-- Returns {answers, reason, reason, ...}: one string of signed 64-bit
-- big-endian integers (one value for the client to read, however many
-- requests), per request in order:
--   1 admitted or 0 denied, then four per counter: count, ms left,
--     deadline (-1 when nothing was counted), and 1 (at its limit) or 2
--     (locked out) when no spend at all can fit until the ms left are over,
--     else 0;
--   -1, i: counter i (from 1) is corrupt; nothing written for this
--     request;
--   -2: the request's arguments are invalid; nothing written;
-- then the reason of each request answered -1 or -2, in order.
-- A refusal that is not about one counter (READONLY, OOM) fails the call;
-- it comes at the call's first write, so nothing was written.
-- Needs PEXPIRETIME (Redis 7.0).
local function whole(sent, max)
  local n = tonumber(sent)
  if n and n >= 0 and n <= max and n % 1 == 0 and string.find(sent, '^%d+$') then
    return n
  end
  return nil
end
local big = 9007199254740991
local u64 = 18446744073709551615
local time = redis.call('TIME')
local now = math.floor((tonumber(time[1]) * 1000000 + tonumber(time[2])) / 1000)
local nums = {}
local why = {}
local function put(v)
  nums[#nums + 1] = v
end

-- One request: `k` KEYS and `a` ARGV read before it, `n` counters.
local function spend(k, a, n)
  local cost_sent = ARGV[a + 2]
  local cost = whole(cost_sent, u64)
  local open = ARGV[a + 3] == '1'
  local block = whole(ARGV[a + 4], big)
  if not cost or not block then
    put(-2)
    why[#why + 1] = 'ERR tower-pinned-window: invalid spend'
    return
  end
  local step = math.max(cost, 1)
  local counters = {}
  for i = 1, n do
    local limit = whole(ARGV[a + 3 + 2 * i], u64)
    local window = whole(ARGV[a + 4 + 2 * i], big)
    if not limit or not window or window < 1 then
      put(-2)
      why[#why + 1] = 'ERR tower-pinned-window: invalid limit or window'
      return
    end
    counters[i] = {key = KEYS[k + 2 * i - 1], lock = KEYS[k + 2 * i], limit = limit,
      window = window}
  end
  local admitted = true
  for i = 1, n do
    local c = counters[i]
    -- GET answers a string, nil (false in Lua) for no key, or an error
    -- for a key of another type, which TYPE then names.
    local value = redis.pcall('GET', c.key)
    local count = 0
    if type(value) == 'table' then
      put(-1)
      put(i)
      why[#why + 1] = 'a key of type ' .. redis.call('TYPE', c.key).ok
      return
    elseif value then
      if not string.find(value, '^%d+$') or (#value > 1 and string.sub(value, 1, 1) == '0')
          or #value > 19 then
        put(-1)
        put(i)
        why[#why + 1] = 'value ' .. string.sub(value, 1, 64)
        return
      end
      count = tonumber(value)
    end
    local locked = redis.call('PTTL', c.lock)
    if locked == -1 then
      put(-1)
      put(i)
      why[#why + 1] = 'a lockout without a lifetime'
      return
    end
    c.count, c.exists, c.locked = count, value ~= false, locked
    c.fits = locked == -2 and count + step <= c.limit
    admitted = admitted and c.fits
  end
  put(admitted and 1 or 0)
  for i = 1, n do
    local c = counters[i]
    local count, left, deadline, full = c.count, 0, -1, 0
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
      if cost > 0 or c.exists or open then
        if cost > 0 then
          count = redis.call('INCRBY', c.key, cost_sent)
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
    elseif c.fits then
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
        full = 2
      elseif expiry > 0 then
        left = math.max(expiry - now, 0)
        if c.count >= c.limit then
          full = 1
        end
      else
        left = c.window
      end
    end
    put(count)
    put(left)
    put(deadline)
    put(full)
  end
end

local k, a = 0, 0
while a < #ARGV do
  local n = whole(ARGV[a + 1], 4096)
  if not n or n < 1 or k + 2 * n > #KEYS or a + 4 + 2 * n > #ARGV then
    return redis.error_reply('ERR tower-pinned-window: invalid spend batch')
  end
  spend(k, a, n)
  k, a = k + 2 * n, a + 4 + 2 * n
end
if k ~= #KEYS then
  return redis.error_reply('ERR tower-pinned-window: invalid spend batch')
end
-- Packed 512 numbers at a time: unpack puts each one on Lua's stack.
local parts = {}
for at = 1, #nums, 512 do
  local last = math.min(at + 511, #nums)
  parts[#parts + 1] = struct.pack('>' .. string.rep('i8', last - at + 1), unpack(nums, at, last))
end
local out = { table.concat(parts) }
for r = 1, #why do
  out[1 + r] = why[r]
end
return out
