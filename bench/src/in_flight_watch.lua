-- The in-flight soak's look at the store (bench/src/bin/in_flight_soak.rs,
-- `watch`), in one atomic step, read only.
-- ARGV[1]: the pattern of the run's keys (`PREFIX*`).
-- Returns this server's clock (Unix ms, the clock the leases are scored
-- on), then one line per key: `KEY PTTL TYPE` and, for a sorted set (a
-- record of slots), its members grouped by the first 16 hex digits of their
-- names (the process that made the slot): `PROCESS:MEMBERS:LIVE`, LIVE
-- those whose lease (score) ends after now.
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {string.format('%d', now)}
for _, key in ipairs(redis.call('KEYS', ARGV[1])) do
  local kind = redis.call('TYPE', key).ok
  local line = key .. ' ' .. string.format('%d', redis.call('PTTL', key)) .. ' ' .. kind
  if kind == 'zset' then
    local by, order = {}, {}
    local members = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
    for i = 1, #members, 2 do
      local process = string.sub(members[i], 1, 16)
      if not by[process] then
        by[process] = {0, 0}
        order[#order + 1] = process
      end
      by[process][1] = by[process][1] + 1
      if tonumber(members[i + 1]) > now then
        by[process][2] = by[process][2] + 1
      end
    end
    for _, process in ipairs(order) do
      line = line .. ' ' .. process .. ':' .. by[process][1] .. ':' .. by[process][2]
    end
  end
  out[#out + 1] = line
end
return out
