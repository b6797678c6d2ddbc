-- wrk script: a per-request client key header drawn from KEYS distinct values (env, default 1).
local keys = tonumber(os.getenv("KEYS") or "1")
local counter = 0
request = function()
  counter = counter + 1
  local k = counter % keys
  return wrk.format("GET", "/", { ["x-client-key"] = "k" .. k })
end
