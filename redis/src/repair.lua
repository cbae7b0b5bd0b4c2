-- tower-pinned-window: attach a lifetime to a counter that has none.
-- KEYS[1]: the key. ARGV[1]: the window in milliseconds.
-- Returns 1 when it attached one, 0 when the key had a lifetime, -1 when the
-- key is not a counter (never given a lifetime: corrupt state must not vanish).
if redis.call('TYPE', KEYS[1]).ok ~= 'string' or not string.match(redis.call('GET', KEYS[1]), '^%d+$') then
  return -1
end
if redis.call('PTTL', KEYS[1]) == -1 then
  return redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return 0
