#!/usr/bin/env bash
# Retry storm: every client has a payment in flight when PostgreSQL goes
# down for OUTAGE_S (10) seconds, and every client retries as the client
# library does, with its key, until the database is back and its payment
# is made. Run twice on one release instance: with the library's full
# jitter, and without it (every wait the backoff's whole ceiling), to show
# what the jitter is for.
#
#   loadtest/retry-storm.sh           # CLIENTS=2000, OUTAGE_S=10, KEEP_PAYING_S=20
#
# PostgreSQL is the instance's own (loadtest/one-instance.sh), which the
# script stops with `pg_ctl stop -m immediate`, as in a crash, and starts
# again; the machine's own servers are never touched. The service and the
# load generator run on CPUs of their own; SPLIT_CPUS=0 shares them.
#
# Every client goes on paying for KEEP_PAYING_S after the database is back
# (a new payment, with a new key, as soon as one ends), so that the crowd
# that returns asks for more than the instance sustains; KEEP_PAYING_S=0
# gives each client its one payment.
#
# First a warm-up (closed loop for WARMUP_S, 20, not reported: on empty
# tables the first minute runs faster than any after it), then the
# instance's sustainable rate (closed loop, 32 clients), then each storm,
# each followed by the closed loop again. A storm's S is the mean of the
# closed loops just before and just after it (a virtual machine's rate
# drifts from one minute to the next). Per storm: the calls paid and given up, when the last payment
# was made after the database came back, what the attempts after its
# return were answered (paid, shed as overloaded, other), the payments per
# second while the clients went on paying ÷ S (goodput, the first second
# of reconnecting included), the paying attempts' p99, and the server's
# peak RSS; then a timeline, per second. The money invariants are checked
# on the database after each run.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
. scripts/lib/services.sh
. loadtest/one-instance.sh

clients=${CLIENTS:-2000}
outage_s=${OUTAGE_S:-10}
duration=${DURATION_S:-20}
keep_paying=${KEEP_PAYING_S:-20}
warmup=${WARMUP_S:-20}
port=${STORM_PORT:-8098}
work=.tmp/retry-storm
mkdir -p "$work"

build_release
trap stop_private_stores EXIT
start_private_stores
start_instance retry-storm "$port"

# One run: its name, then wallet-loadtest run arguments.
measure() {
  local name=$1; shift
  reset_peak_rss
  "${on_loadtest_cpus[@]}" "$loadtest" run "$@" --target "http://127.0.0.1:$port" --database-url "$db_url" --json --quiet > "$work/$name.json"
  peak_rss_kib > "$work/$name.rss_kib"
}

closed_loop() { measure "$1" throughput --concurrency 32 --users 256 --duration-s "$2"; }

echo "retry-storm: warm-up, closed loop at 32 clients for $warmup s" >&2
closed_loop warm-up "$warmup"
echo "retry-storm: sustainable rate, closed loop at 32 clients" >&2
closed_loop sustainable "$duration"
for jitter in on off; do
  echo "retry-storm: $clients clients, PostgreSQL down ${outage_s} s, jitter $jitter" >&2
  # One user per client: two payments of one user inside the 1 ms window
  # would meet the cooldown, which is not what this measures.
  measure "jitter-$jitter" retry-storm --concurrency "$clients" --users "$clients" \
      --attempts-max 30 --call-time-max-s 60 $([ "$jitter" = off ] && echo --no-jitter) \
      --outage-begin "$scratch/down" --outage-end "$scratch/up" --outage-s "$outage_s" --keep-paying-s "$keep_paying"
  echo "retry-storm: closed loop at 32 clients again" >&2
  closed_loop "after-$jitter" "$duration"
done

python3 - "$work" <<'PY'
import json, math, sys
work = sys.argv[1]
rate = lambda name: json.load(open(f"{work}/{name}.json"))["accepted_per_s"]
before = {"on": "sustainable", "off": "after-on"}
print("Sustainable rate, closed loop at 32 clients: "
      + ", ".join(f"{rate(name):.0f}" for name in ("sustainable", "after-on", "after-off"))
      + " transfers/s (before the storms, after the one with jitter, after the one without).")
print()
print("| jitter | S around it | calls paid | gave up | last payment after the database was back "
      "| attempts after it: paid / shed / other | goodput while paying ÷ S | best second ÷ S | paying attempt p99 "
      "| peak RSS |")
print("|---|---|---|---|---|---|---|---|---|---|")
timelines = {}
for jitter in ("on", "off"):
    report = json.load(open(f"{work}/jitter-{jitter}.json"))
    recovery = report["recovery"]
    sustainable = (rate(before[jitter]) + rate(f"after-{jitter}")) / 2
    after = recovery["after_return"]
    # Whole seconds after the return: the busiest one, against S.
    back = math.ceil(recovery["outage_s"])
    best = max((s["paid"] for s in recovery["seconds"][back:]), default=0)
    rss = int(open(f"{work}/jitter-{jitter}.rss_kib").read()) / 1024
    goodput = recovery["paid_per_s_while_paying"]
    goodput = f"{goodput / sustainable:.2f}" if goodput is not None else "–"
    print(f"| {jitter} | {sustainable:.0f} | {recovery['paid']} | {recovery['gave_up']} | {recovery['last_paid_after_s']:.1f} s "
          f"| {after['paid']} / {after['overloaded']} / {after['other']} | {goodput} | {best / sustainable:.2f} "
          f"| {recovery['paying_attempt_p99_ms']:.1f} ms | {rss:.0f} MiB |")
    timelines[jitter] = recovery["seconds"]
print()
print(f"Per second from the database going down (it was back after {recovery['outage_s']:.1f} s): "
      "attempts answered / payments made / refused as overloaded.")
print()
print("| second | " + " | ".join(f"jitter {j}" for j in timelines) + " |")
print("|---|" + "---|" * len(timelines))
for second in range(max(len(t) for t in timelines.values())):
    rows = [t[second] if second < len(t) else {"attempts": 0, "paid": 0, "overloaded": 0} for t in timelines.values()]
    if all(row["attempts"] == 0 for row in rows):
        continue
    print(f"| {second} | " + " | ".join(f"{r['attempts']} / {r['paid']} / {r['overloaded']}" for r in rows) + " |")
PY
