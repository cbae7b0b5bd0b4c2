-- tower-pinned-window: raise a counter's count to at least a number, the
-- provider's word (see the backend contract, "The provider's word"), in
-- one atomic step: never past the quota's limit, never lowered. A live
-- counter keeps its lifetime (SET ... KEEPTTL). A missing one is created
-- at min(count, limit) with the lifetime min(within, window), in the same
-- step; one found without a lifetime (older code) gets that lifetime too.
-- A count of 0 writes nothing.
-- KEYS[1]: the counter. ARGV: the count; the quota's limit; its window in
-- milliseconds; the provider's reset (`within`) in milliseconds. Counts
-- and limits are decimal strings of at most 19 digits, compared as
-- strings, so they are exact past 2^53.
-- Returns {count, ms left, deadline}: the counter after the step, its
-- count as a decimal string, its deadline its absolute expiry in Unix
-- milliseconds (PEXPIRETIME); ms left and deadline are -1 when there is
-- no counter (a count of 0 on a missing one: ms left is then the lifetime
-- it would have had) or it has no lifetime. Or {reason} for a counter that
-- is not an integer (or a key of another type), checked before anything
-- is written, and left as it is.
-- Needs PEXPIRETIME (Redis 7.0) and KEEPTTL (6.0). Time is the server's
-- (TIME), as for every window.
local function digits(sent)
  return sent and string.find(sent, '^%d+$') and #sent <= 19
      and (#sent == 1 or string.sub(sent, 1, 1) ~= '0')
end
local function whole(sent)
  local n = tonumber(sent)
  if n and n >= 1 and n <= 9007199254740991 and n % 1 == 0 and string.find(sent, '^%d+$') then
    return n
  end
  return nil
end
-- Whether the count `a` is below `b`, both as `digits` checks them.
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  for i = 1, #a do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then
      return x < y
    end
  end
  return false
end
local count, limit = ARGV[1], ARGV[2]
local window, within = whole(ARGV[3]), whole(ARGV[4])
if #KEYS ~= 1 or #ARGV ~= 4 or not digits(count) or not digits(limit) or limit == '0'
    or not window or not within then
  return redis.error_reply('ERR tower-pinned-window: invalid raise')
end
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' then
  return {'a key of type ' .. redis.call('TYPE', KEYS[1]).ok}
elseif value and not digits(value) then
  return {'value ' .. string.sub(value, 1, 64)}
end
local time = redis.call('TIME')
local now = math.floor((tonumber(time[1]) * 1000000 + tonumber(time[2])) / 1000)
local lifetime = math.min(window, within)
if count == '0' then
  if not value then
    return {'0', lifetime, -1}
  end
  local expiry = redis.call('PEXPIRETIME', KEYS[1])
  if expiry < 0 then
    return {value, -1, -1}
  end
  return {value, math.max(expiry - now, 0), expiry}
end
local target = count
if below(limit, count) then
  target = limit
end
if not value then
  local expiry = now + lifetime
  redis.call('SET', KEYS[1], target, 'PXAT', string.format('%d', expiry))
  return {target, lifetime, expiry}
end
if below(value, target) then
  redis.call('SET', KEYS[1], target, 'KEEPTTL')
  value = target
end
local expiry = redis.call('PEXPIRETIME', KEYS[1])
if expiry == -1 then
  expiry = now + lifetime
  redis.call('PEXPIREAT', KEYS[1], string.format('%d', expiry))
end
return {value, math.max(expiry - now, 0), expiry}
