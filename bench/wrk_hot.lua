-- wrk script: every request carries the same x-client header, so a server
-- keyed by that header counts one hot key.
request = function()
  return wrk.format("GET", "/", { ["x-client"] = "hot" })
end
