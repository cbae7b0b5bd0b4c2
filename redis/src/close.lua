-- tower-pinned-window: close a counter for a span from now, the provider's
-- word (see the backend contract, "The provider's word"), in one atomic
-- step. Its lockout is the marker a spend's lockout is (spend.lua sets it
-- and reads it in its own step): created with the lifetime `span`, or,
-- when a live one ends sooner, moved to end `span` from now (PEXPIREAT).
-- Deadlines only extend: a live lockout that ends later is left as it is.
-- KEYS[1]: the counter; KEYS[2]: its lockout. ARGV[1]: the span in
-- milliseconds.
-- Returns {ms left of the lockout after the step}, or {reason} for a
-- counter that is not an integer (or a key of another type) or a lockout
-- without a lifetime: checked before anything is written, and left as it
-- is. The counter is never written.
-- Needs PEXPIRETIME (Redis 7.0). Time is the server's (TIME), as for every
-- lockout, window and lease.
local span_sent = ARGV[1]
local span = tonumber(span_sent)
if #KEYS ~= 2 or #ARGV ~= 1 or not span or span < 1 or span > 9007199254740991
    or not string.find(span_sent, '^%d+$') then
  return redis.error_reply('ERR tower-pinned-window: invalid close ' .. tostring(span_sent))
end
-- GET answers a string, nil (false in Lua) for no key, or an error for a
-- key of another type, which TYPE then names. A value is a count as a
-- spend reads one.
local value = redis.pcall('GET', KEYS[1])
if type(value) == 'table' then
  return {'a key of type ' .. redis.call('TYPE', KEYS[1]).ok}
elseif value and (not string.find(value, '^%d+$')
    or (#value > 1 and string.sub(value, 1, 1) == '0') or #value > 19) then
  return {'value ' .. string.sub(value, 1, 64)}
end
-- -2 for no lockout (or one that has ended), -1 for one without a lifetime.
local ends = redis.call('PEXPIRETIME', KEYS[2])
if ends == -1 then
  return {'a lockout without a lifetime'}
end
local time = redis.call('TIME')
local now = math.floor((tonumber(time[1]) * 1000000 + tonumber(time[2])) / 1000)
local until_ = now + span
if ends == -2 then
  -- As a spend sets one: the time it was set, with its lifetime.
  redis.call('SET', KEYS[2], string.format('%d', now), 'PXAT', string.format('%d', until_))
elseif ends < until_ then
  redis.call('PEXPIREAT', KEYS[2], string.format('%d', until_))
else
  until_ = ends
end
return {until_ - now}
