-- wrk script shared by the benchmarks: POST the JSON body in the file named by the first
-- script argument (`wrk ... -s post.lua URL -- BODY_FILE`), then print one summary line.
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"

function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
end

done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRK {"requests": %d, "duration_us": %d, "errors": %d, "status_errors": %d, ' ..
    '"p50_us": %d, "p99_us": %d}\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
