-- Keyed transfers for wrk, from many users at once: each request picks a
-- user at random, sends 1 minor unit from their wallet to the next user's,
-- and carries a fresh Idempotency-Key, as a careful client's first attempt
-- does. Counts the answers by status, so that the benchmark reports
-- accepted transfers per second, not requests.
--
--   wrk -t2 -c32 -d10s -s loadtest/wrk/transfers.lua http://127.0.0.1:8090 -- USERS_FILE
--
-- USERS_FILE holds one user per line: "TOKEN FROM_WALLET_ID TO_WALLET_ID".

local threads = {}
local next_thread_id = 1

function setup(thread)
  thread:set("thread_id", next_thread_id)
  next_thread_id = next_thread_id + 1
  table.insert(threads, thread)
end

local users = {}
-- Global, so that done() can read each thread's with thread:get.
answers = {}

function init(args)
  local path = args[1]
  if path == nil then
    error("usage: wrk ... -s transfers.lua URL -- USERS_FILE")
  end
  for line in io.lines(path) do
    local token, from, to = line:match("^(%S+) (%S+) (%S+)$")
    if token then
      users[#users + 1] = {
        auth = "Bearer " .. token,
        body = '{"from_wallet_id":"' .. from .. '","to_wallet_id":"' .. to .. '","amount_minor":1}',
      }
    end
  end
  if #users == 0 then
    error("no users in " .. path)
  end
  -- Each thread its own sequence of keys.
  math.randomseed(os.time() * 1000 + thread_id)
  answers = {}
end

local function hex16()
  return string.format("%04x", math.random(0, 0xffff))
end

-- A random (version 4) UUID.
local function new_key()
  return hex16() .. hex16() .. "-" .. hex16() .. "-4" .. string.sub(hex16(), 2) .. "-"
    .. string.format("%04x", 0x8000 + math.random(0, 0x3fff)) .. "-" .. hex16() .. hex16() .. hex16()
end

function request()
  local user = users[math.random(1, #users)]
  return wrk.format("POST", "/api/v1/transfers", {
    ["Content-Type"] = "application/json",
    ["Authorization"] = user.auth,
    ["Idempotency-Key"] = new_key(),
  }, user.body)
end

function response(status, headers, body)
  answers[status] = (answers[status] or 0) + 1
end

-- One JSON line on stdout for the benchmark: the run's seconds, and the
-- answers by status summed over every thread.
function done(summary, latency, requests)
  local by_status = {}
  for _, thread in ipairs(threads) do
    for status, count in pairs(thread:get("answers")) do
      by_status[status] = (by_status[status] or 0) + count
    end
  end
  local parts = {}
  for status, count in pairs(by_status) do
    parts[#parts + 1] = string.format('"%d":%d', status, count)
  end
  io.write(string.format(
    'WRK_RESULT {"seconds":%.3f,"requests":%d,"errors":%d,"p50_ms":%.2f,"p99_ms":%.2f,"by_status":{%s}}\n',
    summary.duration / 1e6,
    summary.requests,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    latency:percentile(50) / 1000,
    latency:percentile(99) / 1000,
    table.concat(parts, ",")
  ))
end
