-- tower-pinned-window: count several hits on several counters in one call,
-- exactly as if each hit had been sent alone with hit.lua.
-- KEYS[i]: counter i (a key may appear more than once, for hits with another
-- window: the entries are applied in order).
-- ARGV[2i-1]: how many hits counter i takes (n >= 1);
-- ARGV[2i]: its window in milliseconds, attached only when the counter has
-- no lifetime (it was just created, or older code left it without one), in
-- the same atomic step.
-- Returns {clock, answers, i, reason, i, reason, ...}: the server's clock
-- in ms (TIME, read once) when the counters' deadlines follow, or -1 before
-- Redis 7.0, when their times left follow; then one string of two signed
-- 64-bit big-endian integers per key, in order (one value for the client to
-- read, however many keys: a value costs it more to read than its bytes):
--   count, deadline (or ms left)   after all n hits, which took the counts
--                                  count-n+1 .. count; the time left is the
--                                  deadline less the clock (the client
--                                  works it out)
--   -1, 0                          a corrupt counter, left as it was
--   -2, 0                          invalid arguments (nothing written)
-- then, for each key answered -1 or -2, its place (from 1) and why.
-- A refusal that is not about one counter (READONLY, OOM) fails the call.
-- Each counter costs INCRBY and PEXPIRETIME, or INCRBY and PEXPIREAT NX when
-- it is new.
-- Arguments are read as numbers only when they differ from the entry
-- before (most entries repeat a hit count of 1 and one window; Lua compares
-- strings by identity), and INCRBY gets the hit count as sent: turning a
-- number back into text costs Redis more than the command itself.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
-- nil until the first counter tells whether PEXPIRETIME exists (Redis 7.0).
local expiretime = nil
-- A whole number from 1 to max, or nil.
local function whole(sent, max)
  local n = tonumber(sent)
  if n and n >= 1 and n <= max and n % 1 == 0 then
    return n
  end
  return nil
end
-- The last valid hit count and window, as sent and as numbers (nil after an
-- invalid one, so that it is checked again).
local hits_arg, hits = nil, nil
local window_arg, window = nil, nil
-- Two numbers per key, packed at the end; the reasons of the keys refused.
local nums = {}
local why = {}
local function refuse(i, code, reason)
  nums[2 * i - 1] = code
  nums[2 * i] = 0
  why[#why + 1] = i
  why[#why + 1] = reason
end
for i = 1, #KEYS do
  local key = KEYS[i]
  local hits_sent = ARGV[2 * i - 1]
  local window_sent = ARGV[2 * i]
  if hits_sent ~= hits_arg then
    hits = whole(hits_sent, 4294967295)
    hits_arg = hits and hits_sent
  end
  if window_sent ~= window_arg then
    window = whole(window_sent, 9007199254740991)
    window_arg = window and window_sent
  end
  local j = 2 * i - 1
  if hits_arg == nil then
    refuse(i, -2, 'ERR tower-pinned-window: invalid hit count ' .. tostring(hits_sent))
  elseif window_arg == nil then
    refuse(i, -2, 'ERR tower-pinned-window: invalid window ' .. tostring(window_sent))
  else
    local count = redis.pcall('INCRBY', key, hits_sent)
    if type(count) == 'table' then
      local err = count.err or ''
      if not string.find(hits_sent, '^[1-9]%d*$') then
        -- A number Lua reads but INCRBY does not ('01', '1.0', '0x1'): the
        -- argument, not the counter, was refused, and nothing was written.
        refuse(i, -2, 'ERR tower-pinned-window: invalid hit count ' .. hits_sent)
      elseif string.find(err, 'WRONGTYPE', 1, true) or string.find(err, 'not an integer', 1, true)
          or string.find(err, 'overflow', 1, true) then
        local kind = redis.call('TYPE', key).ok
        if kind == 'string' then
          refuse(i, -1, 'value ' .. string.sub(redis.call('GET', key), 1, 64))
        else
          refuse(i, -1, 'a key of type ' .. kind)
        end
      else
        -- Not about this counter (READONLY, OOM, ...): the whole call fails,
        -- as hit.lua's would, so that the connection sees the server's
        -- error (a Sentinel connection moves to the new master on READONLY).
        -- Such a refusal comes at the first write, so nothing was written.
        return redis.error_reply(err)
      end
    elseif count < hits then
      -- The value was negative: put it back as it was.
      redis.call('DECRBY', key, hits_sent)
      refuse(i, -1, 'negative value ' .. tostring(count - hits))
    else
      nums[j] = count
      local deadline
      if count == hits and expiretime ~= false then
        -- The counter was just created (or its count refunded to 0): its
        -- window starts now, unless it has a lifetime already (NX, Redis
        -- 7.0). The deadline goes as text written by %d: a number would be
        -- written with %.17g, which costs Redis more than the command.
        local start = now + window
        local set = redis.pcall('PEXPIREAT', key, string.format('%d', start), 'NX')
        if set == 1 then
          deadline, expiretime = start, true
        elseif set == 0 then
          deadline, expiretime = redis.call('PEXPIRETIME', key), true
        end
        -- Refused, which writes nothing (before Redis 7.0 there is no NX):
        -- the counter is read below, as any other.
      end
      if deadline == nil and expiretime == nil then
        deadline = redis.pcall('PEXPIRETIME', key)
        expiretime = type(deadline) == 'number'
      elseif deadline == nil and expiretime then
        deadline = redis.call('PEXPIRETIME', key)
      end
      if expiretime then
        if deadline < 0 then
          -- No lifetime (left so by older code): its window starts now.
          deadline = now + window
          redis.call('PEXPIREAT', key, string.format('%d', deadline))
        end
        nums[j + 1] = deadline
      else
        -- Before Redis 7.0: no deadline, so hits are never refunded.
        local ttl = redis.call('PTTL', key)
        if ttl < 0 then
          redis.call('PEXPIRE', key, window)
          ttl = window
        end
        nums[j + 1] = ttl
      end
    end
  end
end
-- Packed 256 keys at a time: unpack puts each number on Lua's stack.
local parts = {}
for at = 1, #nums, 512 do
  local last = math.min(at + 511, #nums)
  parts[#parts + 1] = struct.pack('>' .. string.rep('i8', last - at + 1), unpack(nums, at, last))
end
local out = { -1, table.concat(parts) }
if expiretime ~= false then
  out[1] = now
end
for k = 1, #why do
  out[2 + k] = why[k]
end
return out
