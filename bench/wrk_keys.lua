-- wrk script: every request carries an x-client header, cycling over
-- 10,000 values, so a server keyed by that header counts 10,000 keys.
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", { ["x-client"] = "c" .. (n % 10000) })
end
