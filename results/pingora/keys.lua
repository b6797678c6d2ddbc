-- wrk script for results/pingora/run.sh: every request carries `x-client-id: k<N>` with N drawn
-- round-robin from KEYS distinct values (env, default 1). Thread t of THREADS (env, = wrk -t)
-- sends keys t, t+THREADS, t+2*THREADS, ... so the offered load is spread evenly over the keys
-- and no two threads send the same key at the same moment.
-- done() prints one machine-readable RESULT line (latencies in microseconds).
local threads = {}

function setup(thread)
  thread:set("id", #threads)
  table.insert(threads, thread)
end

function init(args)
  keys = tonumber(os.getenv("KEYS") or "1")
  nthreads = tonumber(os.getenv("THREADS") or "1")
  counter = 0
end

function request()
  local k = (counter * nthreads + id) % keys
  counter = counter + 1
  return wrk.format("GET", "/", { ["x-client-id"] = "k" .. k })
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d mean_us=%.1f non2xx=%d connect_err=%d read_err=%d write_err=%d timeouts=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.mean, e.status, e.connect, e.read, e.write, e.timeout))
end
