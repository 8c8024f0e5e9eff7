#!/usr/bin/env bash
# Overload: one release instance driven past the rate it sustains, then
# left alone, to show that what cannot be served in time is refused at
# once (503 /problems/overloaded, Retry-After) while the transfers it
# admits keep their latency, and that it comes back by itself.
#
#   loadtest/overload.sh              # DURATION_S=20 per phase
#
# Phases, on one server and one database:
#   sustainable  closed loop, 32 clients: the rate the instance sustains
#                (S, accepted transfers/s) and its p99;
#   2x, 4x       open loop at 2·S and 4·S requests started per second,
#                whatever the answers (the --rate-per-s of wallet-loadtest);
#   after        closed loop again, once the load has dropped.
# Each phase prints goodput (accepted/s ÷ S), the overload refusals per
# second, the p99 of the accepted transfers, and the server's peak RSS in
# that phase (VmHWM, reset before each phase). Every phase checks the
# money invariants on the database afterwards.
#
# Any WALLET_* variable set in the environment reaches the server, e.g.
# WALLET_TRANSFERS_IN_FLIGHT_MAX=32 to try another admission limit.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
. scripts/lib/services.sh
. loadtest/one-instance.sh
ensure_services

duration=${DURATION_S:-20}
users=${USERS:-256}
port=${OVERLOAD_PORT:-8096}
db_name=layered_wallet_overload
work=.tmp/overload
mkdir -p "$work"

build_release
psql "$PG_SERVER_URL" -qc "DROP DATABASE IF EXISTS $db_name WITH (FORCE)" >/dev/null
psql "$PG_SERVER_URL" -qc "CREATE DATABASE $db_name" >/dev/null
db_url=$(database_url "$db_name")
server_pid=
trap '[ -z "$server_pid" ] || { kill $server_pid 2>/dev/null; wait $server_pid 2>/dev/null; } || true' EXIT
start_instance overload "$port" "$db_url"

# One phase: its name, then wallet-loadtest arguments.
phase() {
  local name=$1; shift
  reset_peak_rss
  "$loadtest" run throughput --target "http://127.0.0.1:$port" --database-url "$db_url" \
      --users "$users" --duration-s "$duration" --json --quiet "$@" > "$work/$name.json"
  peak_rss_kib > "$work/$name.rss_kib"
}

echo "overload: sustainable rate, closed loop at 32 clients" >&2
phase sustainable --concurrency 32
sustainable=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["accepted_per_s"])' "$work/sustainable.json")
for times in 2 4; do
  rate=$(python3 -c "print(round($times * $sustainable))")
  echo "overload: open loop at ${times}x, $rate requests/s" >&2
  # --concurrency sizes the client's connection pool in open loop.
  phase "${times}x" --rate-per-s "$rate" --concurrency 1024
done
echo "overload: closed loop at 32 clients again" >&2
phase after --concurrency 32

python3 - "$work" "$sustainable" <<'PY'
import json, sys
work, sustainable = sys.argv[1], float(sys.argv[2])
print("| phase | offered | accepted/s | goodput ÷ sustainable | overloaded 503/s | other refusals | p99 accepted | peak RSS |")
print("|---|---|---|---|---|---|---|---|")
for name, offered in [("sustainable", "closed loop, 32 clients"), ("2x", None), ("4x", None), ("after", "closed loop, 32 clients")]:
    report = json.load(open(f"{work}/{name}.json"))
    summary = report
    rows = summary["outcomes"]
    accepted = [r for r in rows if 200 <= r["status"] < 300 and r["outcome"] != "replayed"]
    overloaded = sum(r["count"] for r in rows if r["status"] == 503 and r["layer"] == "none")
    other = sum(r["count"] for r in rows if r["status"] >= 300) - overloaded + summary["transport_errors"]
    p99 = max((r["p99_ms"] for r in accepted), default=float("nan"))
    if offered is None:
        offered = f"{summary['requests'] / summary['elapsed_s']:.0f} requests/s, open loop"
    rss = int(open(f"{work}/{name}.rss_kib").read()) / 1024
    print(f"| {name} | {offered} | {summary['accepted_per_s']:.0f} | {summary['accepted_per_s'] / sustainable:.2f} "
          f"| {overloaded / summary['elapsed_s']:.0f} | {other} | {p99:.1f} ms | {rss:.0f} MiB |")
PY
