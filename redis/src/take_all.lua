-- tower-pinned-window: take a slot of a key's requests in flight and count
-- the request's counters, in one atomic step (the backend contract's
-- "Quotas and a cap in one step"), for one or more requests in order, each
-- exactly as if it had been its own call: a request sees the record and
-- the counters as the requests before it in the call left them.
-- Per request, in order:
--   KEYS: the record of the key's slots; then counter i, for each of its
--         n counters, followed by counter i's lockout when the request
--         spends;
--   ARGV: one argument, its words apart by a space: the slot's name; the
--         cap's max; the lease in milliseconds; n; the cost, or '-' for
--         plain hits (counted as hit.lua counts them); '1' to open a
--         missing counter at a cost of 0; the lockout in milliseconds, '0'
--         for none; then counter i's limit and window in milliseconds, for
--         each counter ('<slot> 2 30000 1 - 0 0 100 60000'); then, for a
--         spend whose first counter is spent an amount of its own instead
--         of the cost (Spend::first), the word 'first' and that amount
--         ('<slot> 2 30000 2 700 0 0 50 60000 10000 60000 first 1').
-- Each request:
--   1. checks everything it reads before it writes anything: the record
--      (slots.lua's check) and each counter (and lockout) as hit.lua or
--      spend.lua would; a corrupt one refuses the request, nothing written;
--   2. drops the record's leases that ran out (as take.lua);
--   3. a slot the record already holds: granted, nothing changes, the
--      counters are read, not counted;
--   4. a full cap: refused, nothing changes, the counters are read (a
--      missing one reads 0 with its full window);
--   5. else the counters are counted, as hit.lua (plain hits) or spend.lua
--      (a spend, all or nothing, with its lockouts) counts them; when every
--      count is within its limit, the slot is added with its lease and the
--      record lives at least that long (as take.lua); otherwise no slot.
-- Returns {answers, reason, reason, ...}: one string of signed 64-bit
-- big-endian integers (one value for the client to read, however many
-- requests), per request in order:
--   code, in use, ms, then four per counter: count, ms left, deadline (-1
--     when nothing was counted), and 1 (at its limit) or 2 (locked out)
--     when no step can fit it until the ms left are over, else 0; code 1:
--     the slot is granted (held already, or taken now), in use after it;
--     0: refused by the cap, with the ms until the earliest lease runs
--     out; 2: refused by the counters, no slot taken;
--   -1, i: corrupt, nothing written: the record (i = 0) or counter i
--     (from 1);
--   -2: the request's arguments are invalid; nothing written;
-- then the reason of each request answered -1 or -2, in order.
-- A refusal that is not about one key (READONLY, OOM) fails the call; it
-- comes at the call's first write, so nothing was written.
-- Needs PEXPIRETIME (Redis 7.0).
local u64 = 18446744073709551615
local big = 9007199254740991
-- A whole number from 0 to max, as sent in digits only, or nil.
local function whole(sent, max)
  local n = tonumber(sent)
  if n and n >= 0 and n <= max and n % 1 == 0 and string.find(sent, '^%d+$') then
    return n
  end
  return nil
end
local now = now_ms()
local now_text = int(now)
local nums, np, why = {}, 0, {}
local function put(n)
  np = np + 1
  nums[np] = n
end

-- An amount sent on to INCRBY as it was sent: a whole number, without the
-- leading zero INCRBY refuses.
local function amount(sent)
  if sent and #sent > 1 and string.sub(sent, 1, 1) == '0' then
    return nil
  end
  return whole(sent, u64)
end

-- A request's argument read: its words as numbers, or `refused` why not;
-- nil when even its number of counters cannot be read.
local function read(sent)
  local words = {}
  for word in string.gmatch(sent or '', '[^ ]+') do
    words[#words + 1] = word
  end
  local n = whole(words[4], 4096)
  if not n or (#words ~= 7 + 2 * n and #words ~= 9 + 2 * n) then
    return nil
  end
  local r = { slot = words[1], n = n, spends = words[5] ~= '-', limits = {}, windows = {} }
  r.max, r.lease = whole(words[2], u64), millis(words[3])
  if not is_slot(r.slot) then
    r.refused = 'ERR tower-pinned-window: invalid slot ' .. tostring(r.slot)
    return r
  end
  if not r.max or r.max < 1 or not r.lease then
    r.refused = 'ERR tower-pinned-window: invalid cap ' .. words[2] .. ' ' .. words[3]
    return r
  end
  if #words == 9 + 2 * n then
    -- The first counter's own amount: only for a spend.
    r.first_arg = words[9 + 2 * n]
    r.first = r.spends and words[8 + 2 * n] == 'first' and amount(r.first_arg) or nil
    if not r.first then
      r.refused = 'ERR tower-pinned-window: invalid spend'
      return r
    end
  end
  if r.spends then
    r.cost_arg, r.cost = words[5], amount(words[5])
    r.open, r.block = words[6] == '1', whole(words[7], big)
    if not r.cost or not r.block then
      r.refused = 'ERR tower-pinned-window: invalid spend'
      return r
    end
  end
  for i = 1, n do
    local limit, window = whole(words[6 + 2 * i], u64), whole(words[7 + 2 * i], big)
    if not limit or not window or window < 1 then
      r.refused = 'ERR tower-pinned-window: invalid limit or window'
      return r
    end
    r.limits[i], r.windows[i] = limit, window
  end
  return r
end

-- Why the counter's value `value` (GET's answer, false for none) cannot be
-- counted, or nil: as INCR refuses it (hit.lua: not a non-negative
-- integer, or one INCR would overflow) for plain hits, as spend.lua reads
-- it for a spend.
local function bad_value(value, spends)
  if not value then
    return nil
  end
  if not string.find(value, '^%d+$') or (#value > 1 and string.sub(value, 1, 1) == '0')
      or #value > 19 then
    return 'value ' .. string.sub(value, 1, 64)
  end
  if not spends and #value == 19 and value >= '9223372036854775807' then
    return 'value ' .. value
  end
  return nil
end

-- Per counter of the request: key, lockout, count, whether it exists, its
-- lockout's PTTL (-2 for none).
local keys, locks, counts, exist, lockeds = {}, {}, {}, {}, {}

-- Request `r`'s record and counters (`k` KEYS before it) read and
-- checked, before anything is written: nil when all can be counted, else
-- which is corrupt (0 the record, i counter i) and why. Read only.
local function check(k, r)
  local record = KEYS[k + 1]
  local per = r.spends and 2 or 1
  local bad = not_slots(record)
  if bad then
    return 0, bad
  end
  for i = 1, r.n do
    local key = KEYS[k + 1 + per * (i - 1) + 1]
    keys[i] = key
    -- GET answers a string, nil (false in Lua) for no key, or an error
    -- for a key of another type, which TYPE then names.
    local value = redis.pcall('GET', key)
    local reason = nil
    if type(value) == 'table' then
      reason = 'a key of type ' .. redis.call('TYPE', key).ok
    else
      reason = bad_value(value, r.spends)
    end
    if not reason and r.spends then
      locks[i] = KEYS[k + 1 + per * i]
      lockeds[i] = redis.call('PTTL', locks[i])
      if lockeds[i] == -1 then
        reason = 'a lockout without a lifetime'
      end
    end
    if reason then
      return i, reason
    end
    counts[i], exist[i] = tonumber(value) or 0, value ~= false
  end
  return nil
end

-- Each counter's answer: count, ms left, deadline, full.
local out_count, out_left, out_deadline, out_full = {}, {}, {}, {}

-- The counters read, not counted: each as it stands (a missing one at 0
-- with its full window), nothing written.
local function read_counters(r)
  for i = 1, r.n do
    local left, full = r.windows[i], 0
    if exist[i] then
      local ttl = redis.call('PTTL', keys[i])
      if ttl >= 0 then
        left = ttl
        -- No step fits a counter at its limit before its window closes.
        if counts[i] >= r.limits[i] then
          full = 1
        end
      end
    end
    out_count[i], out_left[i], out_deadline[i], out_full[i] = counts[i], left, -1, full
  end
end

-- The counters hit, as hit.lua hits each one: every counter is counted,
-- a new one (or one found without a lifetime) gets its window.
local function hit_counters(r)
  for i = 1, r.n do
    local key = keys[i]
    local count = redis.call('INCR', key)
    local ttl = redis.call('PTTL', key)
    if ttl < 0 then
      redis.call('PEXPIRE', key, int(r.windows[i]))
      ttl = r.windows[i]
    end
    out_count[i], out_left[i] = count, ttl
    out_deadline[i] = redis.call('PEXPIRETIME', key)
    out_full[i] = count > r.limits[i] and 1 or 0
  end
end

-- The counters spent, as spend.lua spends a request: all or nothing, a
-- lockout set on each counter that did not fit when the spend asks for
-- one.
local function spend_counters(r)
  local block = r.block
  -- Each counter's cost (as a number and as sent): the first counter's own
  -- amount when the spend has one.
  local costs, cost_args = {}, {}
  for i = 1, r.n do
    costs[i], cost_args[i] = r.cost, r.cost_arg
  end
  if r.first then
    costs[1], cost_args[1] = r.first, r.first_arg
  end
  local admitted = true
  local fitting = {}
  for i = 1, r.n do
    fitting[i] = lockeds[i] == -2 and counts[i] + math.max(costs[i], 1) <= r.limits[i]
    admitted = admitted and fitting[i]
  end
  for i = 1, r.n do
    local key, count, exists, locked = keys[i], counts[i], exist[i], lockeds[i]
    local limit, window = r.limits[i], r.windows[i]
    local cost, step = costs[i], math.max(costs[i], 1)
    local left, deadline, full = 0, -1, 0
    local expiry = -2
    if exists then
      expiry = redis.call('PEXPIRETIME', key)
      if expiry == -1 then
        -- No lifetime (left so by older code): its window starts now.
        expiry = now + window
        redis.call('PEXPIREAT', key, int(expiry))
      end
    end
    if admitted then
      if cost > 0 or exists or r.open then
        if cost > 0 then
          count = redis.call('INCRBY', key, cost_args[i])
        elseif not exists then
          redis.call('SET', key, '0')
        end
        if not exists then
          expiry = now + window
          redis.call('PEXPIREAT', key, int(expiry))
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
        count = math.max(count, limit)
      end
      count = count + step
      if locked == -2 and block > 0 then
        redis.call('SET', locks[i], now_text, 'PX', int(block))
        locked = block
      end
      if locked >= 0 then
        left = locked
        full = 2
      elseif expiry > 0 then
        left = math.max(expiry - now, 0)
        if counts[i] >= limit then
          full = 1
        end
      else
        left = window
      end
    end
    out_count[i], out_left[i], out_deadline[i], out_full[i] = count, left, deadline, full
  end
end

-- One request: `k` KEYS before it, `r` its argument read.
local function take_all(k, r)
  if r.refused then
    put(-2)
    why[#why + 1] = r.refused
    return
  end
  local record = KEYS[k + 1]
  local at, reason = check(k, r)
  if at then
    put(-1)
    put(at)
    why[#why + 1] = reason
    return
  end
  redis.call('ZREMRANGEBYSCORE', record, '-inf', now_text)
  local held = redis.call('ZCARD', record)
  local code, in_use, ms = 1, held, 0
  if redis.call('ZSCORE', record, r.slot) then
    -- A step retried: granted, and counted before.
    read_counters(r)
  elseif held >= r.max then
    local earliest = redis.call('ZRANGE', record, '0', '0', 'WITHSCORES')
    code, ms = 0, tonumber(earliest[2]) - now
    read_counters(r)
  else
    if r.spends then
      spend_counters(r)
    else
      hit_counters(r)
    end
    local admitted = true
    for i = 1, r.n do
      admitted = admitted and out_count[i] <= r.limits[i]
    end
    if admitted then
      local ends = now + r.lease
      redis.call('ZADD', record, int(ends), r.slot)
      live_until(record, ends)
      in_use = held + 1
    else
      code = 2
    end
  end
  put(code)
  put(in_use)
  put(ms)
  for i = 1, r.n do
    put(out_count[i])
    put(out_left[i])
    put(out_deadline[i])
    put(out_full[i])
  end
end

local k = 0
for a = 1, #ARGV do
  local r = read(ARGV[a])
  if not r then
    return redis.error_reply('ERR tower-pinned-window: invalid take_all batch')
  end
  local used = 1 + r.n * (r.spends and 2 or 1)
  if k + used > #KEYS then
    return redis.error_reply('ERR tower-pinned-window: invalid take_all batch')
  end
  take_all(k, r)
  k = k + used
end
if k ~= #KEYS then
  return redis.error_reply('ERR tower-pinned-window: invalid take_all batch')
end
-- Packed 512 numbers at a time: unpack puts each one on Lua's stack.
local parts = {}
for at = 1, np, 512 do
  local last = math.min(at + 511, np)
  parts[#parts + 1] = struct.pack('>' .. string.rep('i8', last - at + 1), unpack(nums, at, last))
end
local out = { table.concat(parts) }
for r = 1, #why do
  out[1 + r] = why[r]
end
return out
