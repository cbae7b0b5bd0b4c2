-- tower-pinned-window: extend the slots a holder still holds, over one or
-- more keys' records.
-- KEYS: the records. ARGV[1]: the lease in milliseconds; then, per record
-- in order, how many of its slots follow, and their names.
-- Each named slot whose lease has not run out gets `now + lease` (or keeps
-- a later end), and its record a lifetime at least that long. A slot that
-- is gone (given back, or its lease ran out) is never added again: another
-- request may hold its place. A record that is not one is skipped and left
-- as it is; the others are extended all the same.
-- Returns {extended, place, place, ...}: the slots extended, then the place
-- (from 1) of each record skipped as corrupt.
local lease = millis(ARGV[1])
if not lease then
  return redis.error_reply('ERR tower-pinned-window: invalid lease ' .. tostring(ARGV[1]))
end
-- Every argument is checked before anything is written.
local at = 2
for _ = 1, #KEYS do
  local n = tonumber(ARGV[at])
  if not n or n < 0 or n % 1 ~= 0 or at + n > #ARGV then
    return redis.error_reply('ERR tower-pinned-window: invalid slot count ' .. tostring(ARGV[at]))
  end
  for i = at + 1, at + n do
    if not is_slot(ARGV[i]) then
      return redis.error_reply('ERR tower-pinned-window: invalid slot ' .. tostring(ARGV[i]))
    end
  end
  at = at + n + 1
end
if at ~= #ARGV + 1 then
  return redis.error_reply('ERR tower-pinned-window: ' .. (#ARGV + 1 - at) .. ' arguments left over')
end
local now = now_ms()
local ends = now + lease
local reply = {0}
local extended = 0
at = 2
for place, record in ipairs(KEYS) do
  local n = tonumber(ARGV[at])
  if not_slots(record) then
    reply[#reply + 1] = place
  else
    local live = false
    for i = at + 1, at + n do
      local score = redis.call('ZSCORE', record, ARGV[i])
      score = score and tonumber(score)
      if score and score > now then
        if score < ends then
          redis.call('ZADD', record, 'XX', int(ends), ARGV[i])
        end
        extended = extended + 1
        live = true
      end
    end
    if live then
      live_until(record, ends)
    end
  end
  at = at + n + 1
end
reply[1] = extended
return reply
