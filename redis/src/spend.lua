-- tower-pinned-window: the spends of one or more requests, in order, each
-- all or nothing over its own counters (see the backend contract, "Costs,
-- lockouts and amends"). A call of several requests changes nothing about
-- each one: a request sees the counters as the requests before it in the
-- call left them, exactly as if each had been its own call.
-- Per request, in order:
--   KEYS: counter i, then its lockout marker, for each of its n counters;
--   ARGV: one argument, its words apart by a space: n; the cost; '1' to
--         open a missing counter at a cost of 0; the lockout in
--         milliseconds, '0' for none; then counter i's limit and window in
--         milliseconds, for each counter ('1 5 0 0 100 60000'); then, when
--         the first counter is spent an amount of its own instead of the
--         cost (Spend::first), the word 'first' and that amount
--         ('2 700 0 0 50 60000 10000 60000 first 1'). One argument costs
--         Redis less than six, and the requests of a call mostly repeat
--         the same one, read only once.
-- Returns {answers, reason, reason, ...}: one string of signed 64-bit
-- big-endian integers (one value for the client to read, however many
-- requests), per request in order:
--   1 admitted or 0 denied, then four per counter: count (for a counter
--     that does not fit, what stands in its way plus the step), ms left,
--     deadline (-1 when nothing was counted), and 1 (at its limit) or 2
--     (locked out) when no spend at all can fit until the ms left are over,
--     else 0;
--   -1, i: counter i (from 1) is corrupt; nothing written for this
--     request;
--   -2: the request's arguments are invalid; nothing written;
-- then the reason of each request answered -1 or -2, in order.
-- A refusal that is not about one counter (READONLY, OOM) fails the call;
-- it comes at the call's first write, so nothing was written.
-- A call may name a marker: its last key, with a last argument 'marker'
-- and a lifetime in ms ('marker 5000'). The call then also writes its
-- answers string there, with that lifetime, in the same atomic step: a
-- client whose reply was lost reads it back to give back what its refused
-- requests spent.
-- Needs PEXPIRETIME (Redis 7.0).
-- Arguments are checked only when they differ from the request's before
-- (most requests of a call repeat one layer's cost, lockout, limit and
-- window; Lua compares strings by identity), and the counters' state is
-- kept in arrays reused from request to request: a table per counter, or
-- a check per argument, costs Redis more than a command.
local function whole(sent, max)
  local n = tonumber(sent)
  if n and n >= 0 and n <= max and n % 1 == 0 and string.find(sent, '^%d+$') then
    return n
  end
  return nil
end
local big = 9007199254740991
-- An amount sent on to INCRBY as it was sent: a whole number, without the
-- leading zero INCRBY refuses.
local function amount(sent, max)
  if sent and #sent > 1 and string.sub(sent, 1, 1) == '0' then
    return nil
  end
  return whole(sent, max)
end
local n_args, n_keys, marker, marker_ms = #ARGV, #KEYS, nil, nil
if n_args > 0 and string.sub(ARGV[n_args], 1, 7) == 'marker ' then
  marker_ms = whole(string.sub(ARGV[n_args], 8), big)
  if not marker_ms or marker_ms < 1 or n_keys < 1 then
    return redis.error_reply('ERR tower-pinned-window: invalid marker')
  end
  marker, n_args, n_keys = KEYS[n_keys], n_args - 1, n_keys - 1
end
local u64 = 18446744073709551615
local time = redis.call('TIME')
local now = math.floor((tonumber(time[1]) * 1000000 + tonumber(time[2])) / 1000)
local nums, np = {}, 0
local why = {}
-- The last request's argument, as sent, and what it says: n, the cost (as
-- sent and as a number), open, the lockout, each counter's limit and
-- window, the first counter's own amount (as sent and as a number; nil
-- when it is spent the cost); `refused` the reason when it is invalid (n
-- is nil when even its number of counters cannot be read).
local said, n_said, cost_arg, cost, open, block = nil, nil, nil, nil, nil, nil
local first_arg, first = nil, nil
local said_limits, said_windows, refused = {}, {}, nil
local function read(sent)
  if sent == said then
    return
  end
  said, refused = sent, nil
  local words = {}
  for word in string.gmatch(sent, '[^ ]+') do
    words[#words + 1] = word
  end
  n_said = whole(words[1], 4096)
  if not n_said or n_said < 1 or (#words ~= 4 + 2 * n_said and #words ~= 6 + 2 * n_said) then
    n_said = nil
    return
  end
  cost_arg, cost = words[2], amount(words[2], u64)
  open, block = words[3] == '1', whole(words[4], big)
  first_arg, first = nil, nil
  if #words == 6 + 2 * n_said then
    first_arg = words[6 + 2 * n_said]
    first = words[5 + 2 * n_said] == 'first' and amount(first_arg, u64) or nil
    if not first then
      refused = 'ERR tower-pinned-window: invalid spend'
      return
    end
  end
  if not cost or not block then
    refused = 'ERR tower-pinned-window: invalid spend'
    return
  end
  said_limits, said_windows = {}, {}
  for i = 1, n_said do
    local limit, window = whole(words[3 + 2 * i], u64), whole(words[4 + 2 * i], big)
    if not limit or not window or window < 1 then
      refused = 'ERR tower-pinned-window: invalid limit or window'
      return
    end
    said_limits[i], said_windows[i] = limit, window
  end
end
-- Per counter of the request: key, lockout, limit, window, cost (as a
-- number and as sent), count, whether it exists, its lockout's PTTL,
-- whether it fits.
local keys, locks, limits, windows, costs, cost_args = {}, {}, {}, {}, {}, {}
local counts, exist, lockeds, fitting = {}, {}, {}, {}

-- A request of one counter with a cost, when it fits: the cost added
-- first, in three commands instead of four. Anything else (a lockout, a
-- count that does not fit, a value INCRBY refuses or a negative one) is
-- put back as it was, and false sends the request down the general way,
-- which reads the counter and answers for it.
local call, pcall_, max = redis.call, redis.pcall, math.max
local function admit_one(key, lock, limit, window)
  -- A cost above the limit could create the counter before it is refused.
  if cost > limit or call('PTTL', lock) ~= -2 then
    return false
  end
  local count = pcall_('INCRBY', key, cost_arg)
  if type(count) == 'table' then
    return false
  end
  if count - cost < 0 or count > limit then
    -- It held a count before (the cost fits the limit): put it back.
    call('DECRBY', key, cost_arg)
    return false
  end
  local expiry = call('PEXPIRETIME', key)
  if expiry == -1 then
    -- Just created (or left without a lifetime by older code): its
    -- window starts now.
    expiry = now + window
    call('PEXPIREAT', key, string.format('%d', expiry))
  end
  nums[np + 1], nums[np + 2], nums[np + 3] = 1, count, max(expiry - now, 0)
  nums[np + 4], nums[np + 5], np = expiry, 0, np + 5
  return true
end

-- A run of `m` requests in a row with the same argument, each a cost on
-- the one counter `key` (a hot key), without a lockout to set: decided at
-- once, exactly as one after the other would be. The first that fit are
-- admitted, in order, by one INCRBY of their costs; the rest are denied
-- at the count they leave. False, with nothing written, sends them down
-- the way of one request at a time: a lockout, a corrupt value, a counter
-- without a lifetime that none of them fits, or numbers past 2^53.
local function admit_run(key, lock, limit, window, m)
  if cost > limit or limit > big or call('PTTL', lock) ~= -2 then
    return false
  end
  local value = pcall_('GET', key)
  if type(value) == 'table' then
    return false
  end
  local count = 0
  if value then
    if not string.find(value, '^%d+$') or (#value > 1 and string.sub(value, 1, 1) == '0')
        or #value > 15 then
      return false
    end
    count = tonumber(value)
  end
  local fit = 0
  if count + cost <= limit then
    fit = math.min(m, math.floor((limit - count) / cost))
  end
  local expiry = -2
  if value then
    expiry = call('PEXPIRETIME', key)
  end
  if fit == 0 and expiry == -1 then
    return false
  end
  if fit > 0 then
    call('INCRBY', key, string.format('%d', fit * cost))
    if expiry < 0 then
      -- Just created (or left without a lifetime by older code): its
      -- window starts now.
      expiry = now + window
      call('PEXPIREAT', key, string.format('%d', expiry))
    end
  end
  local left = max(expiry - now, 0)
  local after = count + fit * cost
  local full = after >= limit and 1 or 0
  for j = 1, m do
    if j <= fit then
      nums[np + 1], nums[np + 2], nums[np + 3] = 1, count + j * cost, left
      nums[np + 4], nums[np + 5] = expiry, 0
    else
      nums[np + 1], nums[np + 2], nums[np + 3] = 0, max(after + cost, limit + 1), left
      nums[np + 4], nums[np + 5] = -1, full
    end
    np = np + 5
  end
  return true
end

-- One request: `k` KEYS read before it, its argument read (`read`), `n`
-- counters.
local function spend(k, n)
  if refused then
    np = np + 1
    nums[np] = -2
    why[#why + 1] = refused
    return
  end
  for i = 1, n do
    keys[i], locks[i] = KEYS[k + 2 * i - 1], KEYS[k + 2 * i]
    limits[i], windows[i] = said_limits[i], said_windows[i]
    costs[i], cost_args[i] = cost, cost_arg
  end
  if first then
    costs[1], cost_args[1] = first, first_arg
  end
  local admitted = true
  for i = 1, n do
    -- GET answers a string, nil (false in Lua) for no key, or an error
    -- for a key of another type, which TYPE then names.
    local value = redis.pcall('GET', keys[i])
    local count = 0
    if type(value) == 'table' then
      nums[np + 1], nums[np + 2], np = -1, i, np + 2
      why[#why + 1] = 'a key of type ' .. redis.call('TYPE', keys[i]).ok
      return
    elseif value then
      if not string.find(value, '^%d+$') or (#value > 1 and string.sub(value, 1, 1) == '0')
          or #value > 19 then
        nums[np + 1], nums[np + 2], np = -1, i, np + 2
        why[#why + 1] = 'value ' .. string.sub(value, 1, 64)
        return
      end
      count = tonumber(value)
    end
    local locked = redis.call('PTTL', locks[i])
    if locked == -1 then
      nums[np + 1], nums[np + 2], np = -1, i, np + 2
      why[#why + 1] = 'a lockout without a lifetime'
      return
    end
    counts[i], exist[i], lockeds[i] = count, value ~= false, locked
    fitting[i] = locked == -2 and count + math.max(costs[i], 1) <= limits[i]
    admitted = admitted and fitting[i]
  end
  np = np + 1
  nums[np] = admitted and 1 or 0
  for i = 1, n do
    local key, count, exists, locked = keys[i], counts[i], exist[i], lockeds[i]
    local cost_i = costs[i]
    local left, deadline, full = 0, -1, 0
    local expiry = -2
    if exists then
      expiry = redis.call('PEXPIRETIME', key)
      if expiry == -1 then
        -- No lifetime (left so by older code): its window starts now.
        expiry = now + windows[i]
        redis.call('PEXPIREAT', key, string.format('%d', expiry))
      end
    end
    if admitted then
      if cost_i > 0 or exists or open then
        if cost_i > 0 then
          count = redis.call('INCRBY', key, cost_args[i])
        elseif not exists then
          redis.call('SET', key, '0')
        end
        if not exists then
          expiry = now + windows[i]
          redis.call('PEXPIREAT', key, string.format('%d', expiry))
        end
        deadline = expiry
        left = math.max(expiry - now, 0)
      end
    elseif fitting[i] then
      if expiry > 0 then
        left = math.max(expiry - now, 0)
      end
    else
      -- The count the spend would have made: what stands in its way (at
      -- least the limit under a lockout) and the step.
      if locked ~= -2 or block > 0 then
        count = math.max(count, limits[i])
      end
      count = count + math.max(cost_i, 1)
      if locked == -2 and block > 0 then
        redis.call('SET', locks[i], string.format('%d', now), 'PX', block)
        locked = block
      end
      if locked >= 0 then
        left = locked
        full = 2
      elseif expiry > 0 then
        left = math.max(expiry - now, 0)
        if counts[i] >= limits[i] then
          full = 1
        end
      else
        left = windows[i]
      end
    end
    nums[np + 1], nums[np + 2], nums[np + 3], nums[np + 4] = count, left, deadline, full
    np = np + 4
  end
end

local k, a = 0, 1
while a <= n_args do
  local sent = ARGV[a]
  if sent ~= said then
    read(sent)
  end
  local n = n_said
  if not n or k + 2 * n > n_keys then
    return redis.error_reply('ERR tower-pinned-window: invalid spend batch')
  end
  -- The requests that follow with the same argument on the same counter.
  local m = 1
  local key = KEYS[k + 1]
  if KEYS[k + 3] == key and n == 1 and not refused and not first and cost > 0 and block == 0 then
    while ARGV[a + m] == sent and KEYS[k + 2 * m + 1] == key do
      m = m + 1
    end
  end
  if m > 1 and admit_run(KEYS[k + 1], KEYS[k + 2], said_limits[1], said_windows[1], m) then
    k, a = k + 2 * m, a + m
  else
    -- Most requests: one counter, a cost, and it fits. A first counter
    -- with an amount of its own goes the general way.
    if refused or n > 1 or cost == 0 or first
        or not admit_one(KEYS[k + 1], KEYS[k + 2], said_limits[1], said_windows[1]) then
      spend(k, n)
    end
    k, a = k + 2 * n, a + 1
  end
end
if k ~= n_keys then
  return redis.error_reply('ERR tower-pinned-window: invalid spend batch')
end
-- Packed 512 numbers at a time: unpack puts each one on Lua's stack.
local parts = {}
for at = 1, np, 512 do
  local last = math.min(at + 511, np)
  parts[#parts + 1] = struct.pack('>' .. string.rep('i8', last - at + 1), unpack(nums, at, last))
end
local out = { table.concat(parts) }
if marker then
  redis.call('SET', marker, out[1], 'PX', string.format('%d', marker_ms))
end
for r = 1, #why do
  out[1 + r] = why[r]
end
return out
