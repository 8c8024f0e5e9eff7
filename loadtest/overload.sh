#!/usr/bin/env bash
# Overload: one release instance driven past the rate it sustains, then
# left alone, to show that what cannot be served in time is refused at
# once (503 /problems/overloaded, Retry-After) while the transfers it
# admits keep their latency, and that it comes back by itself.
#
#   loadtest/overload.sh              # DURATION_S=40 per phase
#
# Phases, on one server and its own PostgreSQL and Redis:
#   warm-up      closed loop for WARMUP_S (20), not reported: on empty tables
#                the first minute runs faster than any after it;
#   sustainable  closed loop, SUSTAINABLE_CLIENTS (32): the rate the instance sustains
#                (S, accepted transfers/s) and its p99;
#   2x           open loop at 2·S requests started per second, whatever the
#                answers (the --rate-per-s of wallet-loadtest);
#   between      closed loop again;
#   4x           open loop at 4·S, S being the first phase's;
#   after        closed loop again, once the load has dropped.
# A virtual machine's rate drifts from one minute to the next, so each
# overload phase's goodput is its accepted/s ÷ the mean of the closed loops
# just before and just after it (both shown), not ÷ one S taken minutes
# earlier. Each phase prints goodput, the overload refusals per second, the
# p99 of the accepted transfers and of the refusals, and the server's peak
# RSS in that phase (VmHWM, reset before each phase). Every phase checks the
# money invariants on the database afterwards.
#
# The service and the load generator run on CPUs of their own
# (loadtest/one-instance.sh says why); SPLIT_CPUS=0 shares them.
# Any WALLET_* variable set in the environment reaches the server, e.g.
# WALLET_TRANSFERS_IN_FLIGHT_MAX=32 to try another admission limit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
. scripts/lib/services.sh
. loadtest/one-instance.sh

duration=${DURATION_S:-40}
warmup=${WARMUP_S:-20}
users=${USERS:-256}
clients=${SUSTAINABLE_CLIENTS:-32}
port=${OVERLOAD_PORT:-8096}
work=.tmp/overload
mkdir -p "$work"

build_release
trap stop_private_stores EXIT
start_private_stores
start_instance overload "$port"

# One phase: its name, then wallet-loadtest arguments.
phase() {
  local name=$1; shift
  echo "overload: $name from $(date -u +%T)" >&2
  reset_peak_rss
  "${on_loadtest_cpus[@]}" "$loadtest" run throughput --target "http://127.0.0.1:$port" --database-url "$db_url" \
      --users "$users" --duration-s "$duration" --json --quiet "$@" > "$work/$name.json"
  peak_rss_kib > "$work/$name.rss_kib"
  echo "overload: $name until $(date -u +%T)" >&2
}

echo "overload: warm-up, closed loop at $clients clients for $warmup s" >&2
duration=$warmup phase warm-up --concurrency "$clients"
echo "overload: sustainable rate, closed loop at $clients clients" >&2
phase sustainable --concurrency "$clients"
sustainable=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["accepted_per_s"])' "$work/sustainable.json")
for times in 2 4; do
  rate=$(python3 -c "print(round($times * $sustainable))")
  echo "overload: open loop at ${times}x, $rate requests/s" >&2
  # --concurrency sizes the client's connection pool in open loop.
  phase "${times}x" --rate-per-s "$rate" --concurrency 1024
  closed=$([ "$times" = 2 ] && echo between || echo after)
  echo "overload: closed loop at $clients clients again ($closed)" >&2
  phase "$closed" --concurrency "$clients"
done

python3 - "$work" "$sustainable" "$clients" <<'PY'
import json, sys
work, sustainable, clients = sys.argv[1], float(sys.argv[2]), sys.argv[3]
print("| phase | offered | accepted/s | S around it | goodput ÷ S | overloaded 503/s | other refusals "
      "| p99 accepted | p99 overloaded 503 | peak RSS |")
print("|---|---|---|---|---|---|---|---|---|---|")
closed = f"closed loop, {clients} clients"
phases = [("sustainable", closed), ("2x", None), ("between", closed), ("4x", None), ("after", closed)]
rate = {name: json.load(open(f"{work}/{name}.json"))["accepted_per_s"] for name, _ in phases}
# An overload phase against the closed loops on either side of it; a
# closed loop against the first.
around = {"2x": ("sustainable", "between"), "4x": ("between", "after")}
for name, offered in phases:
    report = json.load(open(f"{work}/{name}.json"))
    summary = report
    if name in around:
        before, after = around[name]
        reference = (rate[before] + rate[after]) / 2
        reference_text = f"{reference:.0f} ({rate[before]:.0f}, {rate[after]:.0f})"
    else:
        reference, reference_text = sustainable, f"{sustainable:.0f}"
    rows = summary["outcomes"]
    accepted = [r for r in rows if 200 <= r["status"] < 300 and r["outcome"] != "replayed"]
    overloaded = sum(r["count"] for r in rows if r["status"] == 503 and r["layer"] == "none")
    other = sum(r["count"] for r in rows if r["status"] >= 300) - overloaded + summary["transport_errors"]
    p99 = max((r["p99_ms"] for r in accepted), default=float("nan"))
    shed = [r for r in rows if r["status"] == 503 and r["layer"] == "none"]
    shed_p99 = f'{max(r["p99_ms"] for r in shed):.1f} ms' if shed else "–"
    if offered is None:
        offered = f"{summary['requests'] / summary['elapsed_s']:.0f} requests/s, open loop"
    rss = int(open(f"{work}/{name}.rss_kib").read()) / 1024
    print(f"| {name} | {offered} | {summary['accepted_per_s']:.0f} | {reference_text} "
          f"| {summary['accepted_per_s'] / reference:.2f} "
          f"| {overloaded / summary['elapsed_s']:.0f} | {other} | {p99:.1f} ms | {shed_p99} | {rss:.0f} MiB |")
PY
