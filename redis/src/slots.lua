-- tower-pinned-window: the record of a key's slots in flight, shared by the
-- scripts of slots (take, give_back, slots_batch, extend, in_use,
-- repair_slots), each of which is this text followed by its own.
-- The record is a sorted set: a member per slot, its name (32 lowercase hex
-- digits), scored by the end of its lease in Unix milliseconds on this
-- server's clock (TIME). A slot is live while its score is after now. The
-- record's lifetime is never shorter than its latest lease: a holder that
-- dies never leaves it behind for longer than that.

-- Why `key` is not a record of slots (another type, a member that is not a
-- slot's name), or nil when it is one or there is none. Read only.
local function not_slots(key)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then
    return nil
  end
  if kind ~= 'zset' then
    return 'a key of type ' .. kind
  end
  for _, member in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    if #member ~= 32 or not string.find(member, '^[0-9a-f]+$') then
      return 'a member that is not a slot: ' .. string.sub(member, 1, 64)
    end
  end
  return nil
end

-- The record at `key` as a table, read in one command (no TYPE, no
-- scores: a score is a double, which Redis formats and Lua parses):
-- `names`, its slots' names (true each); `count`, how many (live or not);
-- `lifetime`, -1 when there is no record (so none), else nil (not read).
-- Or why it is not a record of slots, as not_slots says it. Read only.
local function slots_of(key)
  -- Numbers as text: Lua would format them with %.14g, which costs Redis
  -- more than the command.
  local got = redis.pcall('ZRANGE', key, '0', '-1')
  if got.err then
    local kind = redis.call('TYPE', key).ok
    if kind ~= 'zset' then
      return 'a key of type ' .. kind
    end
    error(got)
  end
  local names = {}
  for k = 1, #got do
    local member = got[k]
    if #member ~= 32 or not string.find(member, '^[0-9a-f]+$') then
      return 'a member that is not a slot: ' .. string.sub(member, 1, 64)
    end
    names[member] = true
  end
  return { names = names, count = #got, lifetime = #got == 0 and -1 or nil }
end

-- Whether `text` is a slot's name.
local function is_slot(text)
  return type(text) == 'string' and #text == 32 and string.find(text, '^[0-9a-f]+$') ~= nil
end

-- A whole number of milliseconds from 1 to 2^53 - 1, or nil.
local function millis(text)
  local n = tonumber(text)
  if not n or n < 1 or n > 9007199254740991 or n % 1 ~= 0 then
    return nil
  end
  return n
end

-- This server's clock, in Unix milliseconds.
local function now_ms()
  local time = redis.call('TIME')
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- `n` in decimal digits: a Lua number would be sent as `%.17g` or
-- shorter, which can be `1.7e+12`.
local function int(n)
  return string.format('%d', n)
end

-- Give the record at `key` a lifetime until `at` (Unix ms) or later: set
-- when it has none, raised when it ends sooner, never shortened.
local function live_until(key, at)
  local ends = redis.call('PEXPIRETIME', key)
  if ends < 0 or ends < at then
    redis.call('PEXPIREAT', key, int(at))
  end
end
