-- wrk script of benchmarks/serve.py: POST /invocations with the request bodies of a file (one JSON
-- body per line), cycling through them, each connection starting at its own offset; at the end one
-- line "RESULT {...}" with the requests, the duration, p50/p99 latency and the errors.
--   wrk -t1 -c32 -d10s -s benchmarks/serve_load.lua http://127.0.0.1:8000 -- bodies.jsonl [/path]
-- (the path defaults to /invocations)
local bodies = {}
local next_body = 0
local path = "/invocations"

function init(args)
  if args[2] then
    path = args[2]
  end
  for line in io.lines(args[1]) do
    bodies[#bodies + 1] = line
  end
  if #bodies == 0 then
    error("no request bodies in " .. tostring(args[1]))
  end
end

function request()
  next_body = next_body % #bodies + 1
  return wrk.format("POST", path, {["Content-Type"] = "application/json"}, bodies[next_body])
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "socket_errors": %d, "non_2xx": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.timeout, e.status))
end
