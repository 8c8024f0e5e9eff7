#!/usr/bin/env bash
# The benchmark: the hardware's ceilings and the service's figures, measured
# on this machine in one run, each service figure printed as a ratio to its
# ceiling. Writes docs/benchmarks.md.
#
#   loadtest/bench.sh                 # DURATION_S=10 per measurement
#
# Ceilings: pgbench calling the service's own transfer() directly (the
# database alone doing exactly the service's work: 8, 32, 64 clients, and
# 10^3, 10^5, 10^6 wallets) and answering replays with it, pgbench running
# the transfer as plain statements (8, 32, 64 clients, and one hot wallet),
# redis-benchmark on SET NX PX, and the server's own /healthz under the same
# load generator. Service: accepted transfers/s and latency at 8, 32, 128
# and 512 clients and at 32 clients on each wallet count (charted in
# docs/scaling.svg) and with the idempotency table at size (KEYS_AT_SIZE),
# the same load from wrk as a second generator, one hot
# wallet, cooldown rejections/s (with the PostgreSQL transactions they
# caused), replays/s, the server's peak RSS, the same service sending each
# transfer alone (transfers_batch_max = 1), the database alone batched
# (pgbench calling transfer_batch() with the very batches the service
# formed at 32 clients, right after them), /healthz at the transfers'
# pace, and what one accepted transfer
# costs outside PostgreSQL: server CPU (also against one /healthz request),
# Redis commands and round trips, PostgreSQL statements, and PostgreSQL
# round trips counted on the wire. The other entry points, each against
# pgbench calling the same SQL function: deposits credited/s, a backlog of
# broker commands applied/s, payouts accepted/s, the outbox's sending rate
# on a backlog against payout_take() and payout_settle() alone, and its
# sustained rate against the bank gateway simulator's own.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
. scripts/lib/services.sh
ensure_services

duration=${DURATION_S:-10}
port=${BENCH_PORT:-8090}
admin_port=$((port + 1))
db_name=layered_wallet_bench
out=docs/benchmarks.md
work=.tmp/bench
mkdir -p "$work" docs

cargo build --release --workspace --bins >&2
server=target/release/wallet-server
loadtest=target/release/wallet-loadtest
command -v pgbench >/dev/null || apt_install postgresql-contrib
command -v redis-benchmark >/dev/null || apt_install redis-tools
command -v wrk >/dev/null || apt_install wrk

psql "$PG_SERVER_URL" -qc "DROP DATABASE IF EXISTS $db_name WITH (FORCE)" >/dev/null
psql "$PG_SERVER_URL" -qc "CREATE DATABASE $db_name" >/dev/null
# Over loopback without TLS, for pgbench and the service alike: encryption
# between two processes of one machine protects nothing, and the compose
# stack's PostgreSQL offers none. With the Debian default (`ssl = on`),
# `sslmode=prefer` encrypted every round trip.
db_url="$(database_url "$db_name")?sslmode=disable"
DATABASE_URL=$db_url "$server" migrate 2>/dev/null

say() { printf 'bench: %s\n' "$*" >&2; }
# Every measurement starts from a checkpoint, so that one the work before it
# left due (a pgbench run's WAL, the last run's tables) does not spread its
# writes over it: in one run, PostgreSQL's timed checkpoint took the minute
# that held /healthz and the first service runs.
checkpoint() { psql "$db_url" -qc CHECKPOINT >/dev/null; }
json() { python3 -c "import json,sys; d=json.load(open('$1')); print($2)"; }
# pgbench's report of one run: clients, then pgbench's own arguments (the
# run's length, -T or -t, its variables and its scripts). A run that failed
# stops the benchmark with pgbench's own words.
pgbench_report() {
  local clients=$1 report; shift
  checkpoint
  if ! report=$(pgbench "$db_url" -n -M prepared -c "$clients" -j $((clients < 2 ? clients : 2)) --max-tries=10 "$@" \
      2> "$work/pgbench.log"); then
    echo "pgbench failed running $*:" >&2; tail -n 5 "$work/pgbench.log" >&2; exit 1
  fi
  printf '%s\n' "$report"
}
# pgbench's transactions per second running one of loadtest/pgbench's
# scripts: clients, script, then the run's length and variables.
pgbench_tps() {
  local clients=$1 script=$2; shift 2
  pgbench_report "$clients" "$@" -f "loadtest/pgbench/$script" | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}

# --- Ceilings ---------------------------------------------------------------
say "pgbench: the transfer as plain statements"
wallets=1000
# The service's transfers move money among as many users' wallets as
# pgbench's among its wallets. With fewer (it was 64), two batches in
# flight nearly always shared a wallet and waited out each other's commit,
# a wait pgbench's ceiling on 1,000 wallets never met: the service then ran
# at 1,530–1,860 transfers/s where 1,000 users gave 1,580–2,080.
users=$wallets
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
declare -A pg_tps
for clients in 8 32 64; do
  pg_tps[$clients]=$(pgbench_tps "$clients" transfer.sql -T "$duration" -D n=$wallets -D hot=0)
done

say "pgbench: the service's transfer() called directly (the database alone)"
pg_fn_at() { pgbench_tps "$1" transfer_fn.sql -T "$duration" -D n="$2" -D hot=0; } # clients, wallets
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
declare -A pg_fn_by_clients
# PostgreSQL's default max_connections (100) is the reason pgbench stops at 64.
for clients in 8 32 64; do
  pg_fn_by_clients[$clients]=$(pg_fn_at "$clients" "$wallets")
done
pg_fn=${pg_fn_by_clients[32]}

say "redis-benchmark: SET NX PX"
redis_ops=$(redis-benchmark -h 127.0.0.1 -p "$REDIS_PORT" -q -c 32 -n 300000 -r 1000000 \
    SET "bench:cooldown:__rand_int__" token NX PX 5000 | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | tail -n 1 | cut -d' ' -f1)

# --- The service --------------------------------------------------------------
# The server's defaults for two settings that figures here depend on
# (pgbench's batched ceiling runs from as many clients as the service has
# executors), read from docs/settings.md, which the settings' declarations
# generate, so that they are declared in one place.
setting_default() {
  local value
  value=$(sed -n "s/^| \`$1\` | [^|]* | [^|]* | \`\([0-9]*\)\` |.*/\1/p" docs/settings.md)
  [ -n "$value" ] || { echo "no default for $1 in docs/settings.md" >&2; exit 1; }
  printf '%s\n' "$value"
}
workers=$(setting_default http_workers)
executors=$(setting_default transfers_connections)
start_server() { # extra environment for the instance; KEEP_WALLETS=1 keeps the table as it is
  [ -n "${KEEP_WALLETS:-}" ] || psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
  checkpoint
  redis_prefix="bench:$(date +%s%N):"
  env DATABASE_URL="$db_url" REDIS_URL="$REDIS_URL" PORT=$port RUST_LOG=warn WALLET_ADMIN_HTTP_ADDR=127.0.0.1:$admin_port \
      WALLET_ACCOUNT_LIMITS_ENABLED=false WALLET_HTTP_WORKERS=$workers WALLET_TRANSFERS_CONNECTIONS=$executors \
      WALLET_TOKEN_SIGNING_KEY=bench-signing-key-bench-signing-key-0000 \
      WALLET_REDIS_KEY_PREFIX="$redis_prefix" "$@" \
      "$server" serve > "$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "the server did not start; see $work/server.log" >&2; exit 1
}
stop_server() { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
trap 'stop_server' EXIT

target=http://127.0.0.1:$port
run() { # name, then wallet-loadtest run arguments
  local name=$1; shift
  "$loadtest" run "$@" --target "$target" --database-url "$db_url" --duration-s "$duration" --json --quiet > "$work/$name.json"
}

# Throughput: a 1 ms cooldown, so the window never holds back a user's next
# transfer but every request still pays for its Redis round trip.
start_server WALLET_COOLDOWN_TTL_MS=1
say "HTTP ceiling: /healthz (and the server's CPU per request)"
run healthz healthz --concurrency 32 --server-pid "$server_pid"
# The server's count of transfers carried by calls to PostgreSQL, and of
# the calls: sum or count.
batches() { curl -fs "http://127.0.0.1:$admin_port/metrics" | sed -n "s/^wallet_transfer_batch_transfers_$1 //p"; }
# The same histogram's buckets, one per batch size: "size calls" lines,
# each count of calls that carried at most that many transfers.
batch_buckets() {
  curl -fs "http://127.0.0.1:$admin_port/metrics" |
    sed -n 's/^wallet_transfer_batch_transfers_bucket{le="\([0-9]*\)"} \([0-9]*\)$/\1 \2/p'
}
# The database alone, batched: pgbench calling transfer_batch() with the
# very batches the service formed at 32 clients, measured at once after
# them, on the same tables, from as many clients as the service has
# executors. One script per batch size, weighted by the calls of that size
# (pgbench picks a script per transaction by weight): with only their mean,
# rounded, pgbench made fewer calls, each committing more transfers, than
# the service did for the same transfers. Sets batch_sizes (each size the
# service formed and its calls, "size: calls, …") and pg_batch (transfers/s).
database_alone_batched() {
  local args=() sizes=() size calls
  batch_sizes=""
  while read -r size calls; do
    { echo "\\set batch $size"; cat loadtest/pgbench/transfer_batch_fn.sql; } > "$work/batch-$size.sql"
    args+=(-f "$work/batch-$size.sql@$calls"); sizes+=("$size"); batch_sizes+="${batch_sizes:+, }$size: $calls"
  done < <(python3 - "$work/batches-before.txt" "$work/batches-after.txt" <<'PY'
import sys
def read(path):
    return {int(size): int(calls) for size, calls in (line.split() for line in open(path))}
before, after = read(sys.argv[1]), read(sys.argv[2])
below = 0
for size in sorted(after):
    cumulative = after[size] - before.get(size, 0)
    if cumulative > below:
        print(size, cumulative - below)
    below = cumulative
PY
  )
  say "pgbench: transfer_batch() with the service's batches (${sizes[*]} transfers a call), $executors clients"
  pgbench_report "$executors" -T "$duration" -D n=$wallets -D hot=0 "${args[@]}" > "$work/pgbench-batched.txt"
  # Transfers/s: each script's transactions/s times its batch size, in the
  # order given (with one script, pgbench prints no per-script lines).
  pg_batch=$(python3 - "$work/pgbench-batched.txt" "${sizes[@]}" <<'PY'
import re, sys
report, sizes = open(sys.argv[1]).read(), [int(size) for size in sys.argv[2:]]
each = [float(tps) for tps in re.findall(r"^ - \d+ transactions \(.*tps = ([0-9.]+)\)", report, re.M)]
if not each:
    each = [float(re.search(r"^tps = ([0-9.]+)", report, re.M).group(1))]
print(round(sum(tps * size for tps, size in zip(each, sizes))))
PY
  )
}
for clients in 8 32 128 512; do
  say "service: throughput at $clients clients"
  if [ "$clients" = 32 ]; then
    batches_before=("$(batches sum)" "$(batches count)")
    batch_buckets > "$work/batches-before.txt"
  fi
  costs=()
  # At 32 clients, also what each transfer costs outside PostgreSQL,
  # sampled after the sign-ups and with PostgreSQL's statistics settled.
  [ "$clients" = 32 ] && costs=(--server-pid "$server_pid" --redis-url "$REDIS_URL"
    --metrics-url "http://127.0.0.1:$admin_port/metrics" --settle-ms 11000)
  run "throughput-$clients" throughput --concurrency "$clients" --users $((clients * 2 > users ? clients * 2 : users)) "${costs[@]}"
  # The batches the 32-client run formed: transfers per call to PostgreSQL.
  # And the server's peak memory so far, before the larger runs.
  if [ "$clients" = 32 ]; then
    batch_mean=$(python3 -c "print(f'{($(batches sum) - ${batches_before[0]}) / max($(batches count) - ${batches_before[1]}, 1):.2f}')")
    rss_32_kib=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$server_pid/status")
    batch_buckets > "$work/batches-after.txt"
    database_alone_batched
  fi
done
# /healthz again, at the pace the 32-client transfers were accepted: a busy
# server reads many requests per wake-up and a slow one few, so the CPU of
# one request depends on the pace, and this one compares like with like.
say "/healthz at the 32-client transfers' pace"
run healthz-paced healthz --rate-per-s "$(json "$work/throughput-32.json" "round(d['accepted_per_s'])")" --server-pid "$server_pid"
say "wrk: keyed transfers from $users users, same server"
loadtest/wrk/sign_up.py "$target" "$users" > "$work/wrk-users.txt"
wrk -t2 -c32 -d"${duration}s" -s loadtest/wrk/transfers.lua "$target" -- "$work/wrk-users.txt" |
  sed -n 's/^WRK_RESULT //p' > "$work/wrk.json"
rss_kib=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$server_pid/status")
stop_server

# One hot wallet and replays: each right after its ceiling, both from
# freshly set-up tables. This machine's speed drifts from one minute to
# the next (the same run, repeated, moved these two by a factor of two to
# four), and a ratio means something only when its two sides met the
# same machine.
say "pgbench, then the service: one hot wallet"
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
pg_hot=$(pgbench_tps 32 transfer.sql -T "$duration" -D n=$wallets -D hot=1)
start_server WALLET_COOLDOWN_TTL_MS=1
run hot hot-wallet --concurrency 32 --users "$users"
stop_server
say "pgbench, then the service: replays"
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/replay_setup.sql >/dev/null
pg_replay=$(pgbench_tps 32 replay_fn.sql -T "$duration" -D n=$wallets)
start_server WALLET_COOLDOWN_TTL_MS=1
run replay replay --concurrency 32 --users 32
stop_server

# The same service sending each transfer in a call of its own, as it did
# before it batched: four executors, so that four transfers are in
# PostgreSQL at once (one alone would send them one after another).
unbatched_executors=4
start_server WALLET_COOLDOWN_TTL_MS=1 WALLET_TRANSFERS_BATCH_MAX=1 WALLET_TRANSFERS_CONNECTIONS=$unbatched_executors
say "service: throughput at 32 clients, transfers_batch_max = 1"
run unbatched throughput --concurrency 32 --users "$users"
stop_server


# PostgreSQL round trips per transfer, counted on the wire by a proxy
# between the server and PostgreSQL; a run of its own, so that the proxy's
# own cost stays out of the figures above.
wire_port=$((port + 3)); wire_stats_port=$((port + 4))
pg_host_port=$(python3 -c "import socket; from urllib.parse import urlsplit; u = urlsplit('$db_url'); \
  print(f'{socket.gethostbyname(u.hostname or \"127.0.0.1\")}:{u.port or 5432}')")
proxied_url=$(python3 -c "from urllib.parse import urlsplit, urlunsplit; u = urlsplit('$db_url'); \
  print(urlunsplit(u._replace(netloc=u.netloc.replace(f'{u.hostname}:{u.port}' if u.port else u.hostname, '127.0.0.1:$wire_port'), query='sslmode=disable')))")
"$loadtest" pg-wire --listen "127.0.0.1:$wire_port" --upstream "$pg_host_port" \
    --stats-listen "127.0.0.1:$wire_stats_port" 2> "$work/pg-wire.log" &
wire_pid=$!
trap 'stop_server; kill "$wire_pid" 2>/dev/null || true' EXIT
wait_for_port "$wire_stats_port" "the PostgreSQL wire counter"
start_server WALLET_COOLDOWN_TTL_MS=1 DATABASE_URL="$proxied_url"
say "service: PostgreSQL round trips per transfer, on the wire"
run wire throughput --concurrency 32 --users "$users" --pg-wire-url "http://127.0.0.1:$wire_stats_port/"
stop_server
kill "$wire_pid" 2>/dev/null || true
trap 'stop_server' EXIT

# Scaling with the wallets table: 10^5 and 10^6 wallets (10^3 is the run
# above), the database alone and the service at 32 clients on each.
declare -A pg_fn_by_wallets
pg_fn_by_wallets[$wallets]=$pg_fn
for many in 100000 1000000; do
  say "scaling: $many wallets, the database alone then the service"
  psql "$db_url" -q -v n=$many -f loadtest/pgbench/setup.sql >/dev/null
  pg_fn_by_wallets[$many]=$(pg_fn_at 32 "$many")
  KEEP_WALLETS=1 start_server WALLET_COOLDOWN_TTL_MS=1
  run "wallets-$many" throughput --concurrency 32 --users "$users"
  stop_server
done

# The idempotency table at size: KEYS_AT_SIZE completed keys spread over
# the 1,000 users (a day at the measured rate is more: the analysis says
# why this size), the database alone and the service at 32 clients on it.
keys_at_size=${KEYS_AT_SIZE:-10000000}
say "scaling: $keys_at_size idempotency keys, the database alone then the service"
psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
psql "$db_url" -q -v n=$wallets -v keys="$keys_at_size" -f loadtest/pgbench/keys_fill.sql >/dev/null
keys_table=$(psql "$db_url" -Atqc "SELECT pg_size_pretty(pg_total_relation_size('idempotency_keys'))")
pg_fn_at_keys=$(pg_fn_at 32 "$wallets")
KEEP_WALLETS=1 start_server WALLET_COOLDOWN_TTL_MS=1
run keys-at-size throughput --concurrency 32 --users "$users"
stop_server

# Cooldown rejections: a long window and two users, so all but each user's
# first request are refused at the edge. PostgreSQL's transaction counter
# shows what the refusals cost the database. Their ceiling is /healthz on
# the same server right before, for the reason given above the hot wallet:
# measured at the start of the run, minutes earlier, it met another
# machine. Nothing runs between the two: the 11 s the statistics need to
# flush the server's start-up are the /healthz run's (it touches no
# database), not a pause in which the machine could change.
start_server WALLET_COOLDOWN_TTL_MS=600000
say "HTTP ceiling again, for the cooldown: /healthz"
run healthz-cooldown healthz --concurrency 32 --server-pid "$server_pid"
xacts() { psql "$db_url" -Atqc "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = '$db_name'"; }
before=$(xacts)
say "service: cooldown rejections"
run cooldown throughput --concurrency 32 --users 2 --server-pid "$server_pid"
sleep 11; after=$(xacts)
stop_server

# --- The other entry points, each against the database alone -------------------
# Deposits (a provider's webhooks), commands (a broker's backlog) and
# payouts, each beside pgbench calling the same SQL function the service
# calls, with the same arguments, on the same table (1000 wallets and the
# clearing wallets the money moves through).
entry_points_setup() {
  psql "$db_url" -q -v n=$wallets -f loadtest/pgbench/setup.sql >/dev/null
  psql "$db_url" -q -f loadtest/pgbench/clearing_setup.sql >/dev/null
}
pg_entry_point() { pgbench_tps "$1" "$2" -T "$duration" -D n=$wallets; } # clients, script
# The consumers apply one command per partition at a time: as many clients.
partitions=4
say "pgbench: deposit(), broker_command() and payout() called directly (the database alone)"
entry_points_setup
pg_deposit=$(pg_entry_point 32 deposit_fn.sql)
pg_command=$(pg_entry_point "$partitions" command_fn.sql)
pg_payout=$(pg_entry_point 32 payout_fn.sql)
# The dispatcher's work on the backlog payout_fn.sql left in the outbox, a
# batch (the server's default payout_dispatch_batch_rows_max) at a time.
dispatch_batch=32
outbox_rows=$(psql "$db_url" -Atqc "SELECT count(*) FROM payout_outbox")
dispatch_batches=$(((outbox_rows + dispatch_batch - 1) / dispatch_batch))
pg_dispatch_tps=$(pgbench_tps 1 dispatch_fn.sql -t "$dispatch_batches" -D batch=$dispatch_batch)
pg_dispatch=$(python3 -c "print(round($pg_dispatch_tps * $outbox_rows / $dispatch_batches))")

# The service, through the bank gateway simulator on a database of its own.
gateway_port=$((port + 2))
psql "$PG_SERVER_URL" -qc "DROP DATABASE IF EXISTS ${db_name}_gateway WITH (FORCE)" >/dev/null
psql "$PG_SERVER_URL" -qc "CREATE DATABASE ${db_name}_gateway" >/dev/null
target/release/wallet-sim gateway --listen "127.0.0.1:$gateway_port" \
    --database-url "$(database_url "${db_name}_gateway")" > "$work/gateway.log" 2>&1 &
gateway_pid=$!
trap 'stop_server; kill "$gateway_pid" 2>/dev/null || true' EXIT
wait_for_port "$gateway_port" "the gateway simulator"
provider_secret=bench-provider-secret-bench-provider-secret
entry_points_setup
KEEP_WALLETS=1 start_server WALLET_COOLDOWN_TTL_MS=1 WALLET_PAYOUT_GATEWAY_URL="http://127.0.0.1:$gateway_port" \
    WALLET_PROVIDER_WEBHOOK_SECRETS="$provider_secret" WALLET_COMMANDS_ENABLED=true WALLET_COMMANDS_PARTITIONS=$partitions
say "service: deposits"
LOADTEST_PROVIDER_SECRET=$provider_secret "$loadtest" deposits --target "$target" \
    --concurrency 32 --users 64 --duration-s "$duration" --json > "$work/deposits.json"
say "service: a backlog of commands"
"$loadtest" commands --target "$target" --database-url "$db_url" --redis-url "$REDIS_URL" \
    --redis-prefix "$redis_prefix" --partitions $partitions --users 64 --commands $((duration * 300)) \
    --json > "$work/commands.json"
stop_server
# Sending can never outrun accepting for long: for a backlog that feeds the
# dispatcher throughout, payouts are accepted with no instance dispatching
# (for three measurements' time), then one instance that dispatches sends
# them, timed from the first to leave the outbox to the last.
say "service: payouts accepted with no instance dispatching"
payout_server=(WALLET_COOLDOWN_TTL_MS=1 WALLET_PAYOUT_GATEWAY_URL="http://127.0.0.1:$gateway_port")
KEEP_WALLETS=1 start_server "${payout_server[@]}" WALLET_PAYOUT_DISPATCHER_ENABLED=false
"$loadtest" payouts --phase accept --target "$target" --database-url "$db_url" \
    --gateway-url "http://127.0.0.1:$gateway_port" --concurrency 32 --users 64 --duration-s $((duration * 3)) \
    --json > "$work/payouts-accepted.json"
stop_server
say "service: one instance sends the backlog, then the gateway alone"
KEEP_WALLETS=1 start_server "${payout_server[@]}"
"$loadtest" payouts --phase send --target "$target" --database-url "$db_url" \
    --gateway-url "http://127.0.0.1:$gateway_port" --concurrency 32 --duration-s "$duration" \
    --json > "$work/payouts-sent.json"
stop_server
kill "$gateway_pid" 2>/dev/null || true
trap - EXIT

# --- Report -------------------------------------------------------------------
ratio() { python3 -c "print(f'{float($1) / float($2):.2f}')"; }
f() { json "$work/$1.json" "$2"; }
accepted() { f "$1" "round(d['accepted_per_s'])"; }
pct() { f "$1" "[r for r in d['outcomes'] if r['outcome'] in ('accepted','degraded')][0]['$2']"; }
healthz_rps=$(f healthz "round(d['requests_per_s'])")
cooldown_healthz_rps=$(f healthz-cooldown "round(d['requests_per_s'])")
cooldown_rps=$(f cooldown "round(d['cooldown_rejections_per_s'])")
cooldown_n=$(f cooldown "sum(r['count'] for r in d['outcomes'] if r['layer']=='cooldown')")
cooldown_accepted=$(f cooldown "sum(r['count'] for r in d['outcomes'] if r['outcome']=='accepted')")
replay_rps=$(f replay "round(d['replays_per_s'])")

cpu_us=$(f throughput-32 "round(d['costs']['server_cpu_us'] / max(d['costs']['accepted'], 1))")
healthz_cpu_us=$(f healthz "round(d['costs']['server_cpu_us'] / max(d['costs']['accepted'], 1), 1)")
paced_healthz_cpu_us=$(f healthz-paced "round(d['costs']['server_cpu_us'] / max(d['costs']['accepted'], 1), 1)")
paced_healthz_rps=$(f healthz-paced "round(d['requests_per_s'])")
# The load generator's own CPU, which shares the two cores with the server.
gen_cpu_us=$(f throughput-32 "round(d['costs']['load_generator_cpu_us'] / max(d['costs']['accepted'], 1))")
healthz_gen_cpu_us=$(f healthz "round(d['costs']['load_generator_cpu_us'] / max(d['costs']['accepted'], 1), 1)")
# What one cooldown refusal and one /healthz request cost, on the cooldown's server.
per_refusal() { f cooldown "round(d['costs']['$1'] / max($cooldown_n, 1), 1)"; }
per_cooldown_healthz() { f healthz-cooldown "round(d['costs']['$1'] / max(d['costs']['accepted'], 1), 1)"; }
pg_trips=$(f wire "round(d['costs']['pg_round_trips'] / max(d['costs']['accepted'], 1), 2)")
pg_messages=$(f wire "round(d['costs']['pg_query_messages'] / max(d['costs']['accepted'], 1), 2)")
wrk_accepted=$(json "$work/wrk.json" "round(d['by_status'].get('201', 0) / d['seconds'])")
wrk_answers=$(json "$work/wrk.json" "', '.join(f'{k}: {v}' for k, v in sorted(d['by_status'].items()))")
wrk_p50=$(json "$work/wrk.json" "d['p50_ms']"); wrk_p99=$(json "$work/wrk.json" "d['p99_ms']")
redis_cmds=$(f throughput-32 "round(sum(d['costs']['redis_commands'].values()) / max(d['costs']['accepted'], 1), 2)")
redis_by_cmd=$(f throughput-32 "', '.join(f'{k} {v / max(d[\"costs\"][\"accepted\"], 1):.2f}' for k, v in sorted(d['costs']['redis_commands'].items(), key=lambda kv: -kv[1]))")
redis_trips=$(f throughput-32 "round(d['costs']['redis_round_trips'] / max(d['costs']['accepted'], 1), 2)")
pg_xacts=$(f throughput-32 "round(d['costs']['pg_transactions'] / max(d['costs']['accepted'], 1), 2)")
violations=$(python3 -c "import json,glob; print(sum(len((json.load(open(f)).get('invariants') or {}).get('violations', [])) for f in glob.glob('$work/*.json')))")
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)

{
  echo "# Benchmarks"
  echo
  echo "Measured by \`loadtest/bench.sh\` on $(date -u +%Y-%m-%d): $(nproc) cores ($cpu), $(free -g | awk '/Mem:/ {print $2}') GiB,"
  echo "PostgreSQL $(psql "$db_url" -Atqc 'SHOW server_version' | cut -d' ' -f1), Redis $(redis-server --version | sed 's/.*v=\([0-9.]*\).*/\1/')."
  echo "Load generator, server, PostgreSQL and Redis share the machine. ${duration} s per measurement; release build;"
  echo "server defaults ($workers HTTP worker, 16 PostgreSQL connections, of which the $executors transfer executor holds one and sends up to 16 waiting transfers in one call)."
  echo "Every connection to PostgreSQL, pgbench's and the service's, is over loopback without TLS (\`sslmode=disable\`). Absolute figures drift from run to run; the ratios are the point."
  echo
  echo "## Ceilings"
  echo
  echo "| ceiling | figure |"
  echo "|---|---|"
  for clients in 8 32 64; do
    echo "| pgbench, the transfer as plain statements, $clients clients | ${pg_tps[$clients]} transfers/s |"
  done
  echo "| pgbench, one hot wallet, 32 clients | $pg_hot transfers/s |"
  for clients in 8 32 64; do
    echo "| pgbench, the service's \`transfer()\` called directly (the database alone), $clients clients | ${pg_fn_by_clients[$clients]} transfers/s |"
  done
  echo "| pgbench, the service's \`transfer_batch()\` called directly (the database alone, batched): the batches the service formed at 32 clients (mean $batch_mean), each size weighted by its calls, $executors clients (the service's executors), right after the service's run | $pg_batch transfers/s |"
  echo "| pgbench, replays answered by \`transfer()\` directly, 32 clients | $pg_replay replays/s |"
  echo "| redis-benchmark, \`SET … NX PX\`, 32 clients | $redis_ops ops/s |"
  echo "| the server's \`GET /healthz\`, 32 clients, same load generator | $healthz_rps requests/s |"
  echo
  echo "## The service against its ceilings"
  echo
  echo "| measurement | figure | ceiling | ratio | target |"
  echo "|---|---|---|---|---|"
  for clients in 8 32; do
    target="—"; [ "$clients" = 32 ] && target="≥ 1.0"
    echo "| accepted transfers/s, $clients clients (p50 $(pct "throughput-$clients" p50_ms) ms, p99 $(pct "throughput-$clients" p99_ms) ms) | $(accepted "throughput-$clients") | ${pg_tps[$clients]} (statements) | $(ratio "$(accepted "throughput-$clients")" "${pg_tps[$clients]}") | $target |"
  done
  echo "| accepted transfers/s, 32 clients, \`wallet-loadtest\`, against the database alone | $(accepted throughput-32) | $pg_fn (\`transfer()\`) | $(ratio "$(accepted throughput-32)" "$pg_fn") | ≥ 1.0 |"
  echo "| accepted transfers/s, 32 clients, \`wrk\` ($users users; p50 $wrk_p50 ms, p99 $wrk_p99 ms; answers $wrk_answers), against the database alone | $wrk_accepted | $pg_fn (\`transfer()\`) | $(ratio "$wrk_accepted" "$pg_fn") | ≥ 1.0 |"
  echo "| accepted transfers/s, 32 clients, \`wallet-loadtest\`, against the database alone batched the same way | $(accepted throughput-32) | $pg_batch (\`transfer_batch()\`, the same batches) | $(ratio "$(accepted throughput-32)" "$pg_batch") | ≥ 0.9 |"
  echo "| accepted transfers/s, 32 clients, \`transfers_batch_max = 1\` on $unbatched_executors executors (p50 $(pct unbatched p50_ms) ms, p99 $(pct unbatched p99_ms) ms), against the database alone | $(accepted unbatched) | $pg_fn (\`transfer()\`) | $(ratio "$(accepted unbatched)" "$pg_fn") | — |"
  echo "| \`wallet-loadtest\` against \`wrk\`, same server, same run | $(accepted throughput-32) | $wrk_accepted | $(ratio "$(accepted throughput-32)" "$wrk_accepted") | 0.9 – 1.1 |"
  echo "| one hot wallet, 32 clients | $(accepted hot) | $pg_hot | $(ratio "$(accepted hot)" "$pg_hot") | ≥ 2.0 |"
  echo "| cooldown rejections/s, 32 clients | $cooldown_rps | $cooldown_healthz_rps (/healthz, same server, just before) | $(ratio "$cooldown_rps" "$cooldown_healthz_rps") | ≥ 0.5 |"
  echo "| p99 / p50 of accepted transfers, 32 clients | $(pct throughput-32 p99_ms) / $(pct throughput-32 p50_ms) ms | | $(ratio "$(pct throughput-32 p99_ms)" "$(pct throughput-32 p50_ms)") | ≤ 3.0 |"
  echo "| replays/s, 32 clients, against accepted transfers/s | $replay_rps | $(accepted throughput-32) | $(ratio "$replay_rps" "$(accepted throughput-32)") | ≥ 2.0 |"
  echo "| replays/s, 32 clients, against the database alone | $replay_rps | $pg_replay (\`transfer()\`) | $(ratio "$replay_rps" "$pg_replay") | ≥ 0.5 |"
  echo "| server peak RSS, through the 32-client runs | $((rss_32_kib / 1024)) MiB | | | ≤ 64 MiB |"
  echo "| server peak RSS, through the 512-client run and \`wrk\` | $((rss_kib / 1024)) MiB | | | — |"
  echo
  echo "## Scaling"
  echo
  echo "The service at 32 clients keeps 16 PostgreSQL connections whatever the number of clients; pgbench holds one"
  echo "connection per client, and PostgreSQL's default \`max_connections\` (100) stops it past 64. Chart:"
  echo "[\`scaling.svg\`](scaling.svg)."
  echo
  echo "| clients | accepted transfers/s | p50 | p99 | the database alone (\`transfer()\`) | ratio |"
  echo "|---|---|---|---|---|---|"
  for clients in 8 32 128 512; do
    alone=${pg_fn_by_clients[$clients]:-}
    echo "| $clients | $(accepted "throughput-$clients") | $(pct "throughput-$clients" p50_ms) ms | $(pct "throughput-$clients" p99_ms) ms | ${alone:-— (past max_connections)} | $([ -n "$alone" ] && ratio "$(accepted "throughput-$clients")" "$alone" || echo —) |"
  done
  echo
  echo "| wallets | accepted transfers/s, 32 clients | p50 | p99 | the database alone (\`transfer()\`) | ratio |"
  echo "|---|---|---|---|---|---|"
  for many in 1000 100000 1000000; do
    name="wallets-$many"; [ "$many" = "$wallets" ] && name=throughput-32
    echo "| $many | $(accepted "$name") | $(pct "$name" p50_ms) ms | $(pct "$name" p99_ms) ms | ${pg_fn_by_wallets[$many]} | $(ratio "$(accepted "$name")" "${pg_fn_by_wallets[$many]}") |"
  done
  echo
  echo "| idempotency keys held | accepted transfers/s, 32 clients | p50 | p99 | the database alone (\`transfer()\`) | ratio |"
  echo "|---|---|---|---|---|---|"
  echo "| the run's own (a fresh table) | $(accepted throughput-32) | $(pct throughput-32 p50_ms) ms | $(pct throughput-32 p99_ms) ms | $pg_fn | $(ratio "$(accepted throughput-32)" "$pg_fn") |"
  echo "| $keys_at_size more ($keys_table with its indexes) | $(accepted keys-at-size) | $(pct keys-at-size p50_ms) ms | $(pct keys-at-size p99_ms) ms | $pg_fn_at_keys | $(ratio "$(accepted keys-at-size)" "$pg_fn_at_keys") |"
  echo
  echo "## The other entry points against the database alone"
  echo
  echo "Each beside pgbench calling the SQL function the service calls for it, with the same arguments, on the same"
  echo "table. Every deposit debits the provider's one clearing wallet and every payout credits the one holds wallet,"
  echo "in the service and in pgbench alike: that row, not the service, sets both ceilings."
  echo
  echo "| measurement | service | the database alone | ratio | answers other than the one counted |"
  echo "|---|---|---|---|---|"
  echo "| deposits credited/s (first deliveries, signed), 32 clients (p50 $(f deposits "round(d['credited']['p50_ms'], 1)") ms, p99 $(f deposits "round(d['credited']['p99_ms'], 1)") ms) | $(f deposits "round(d['credited']['per_s'])") | $pg_deposit (\`deposit()\`, 32 clients) | $(ratio "$(f deposits "d['credited']['per_s']")" "$pg_deposit") | $(f deposits "d['credited']['other_answers'] or 'none'") |"
  echo "| commands applied/s, a backlog of $(f commands "d['published']") over $partitions partitions, from the first claim to the last commit ($(f commands "round(d['consume_seconds'], 1)") s) | $(f commands "round(d['applied_per_s'])") | $pg_command (\`broker_command()\`, $partitions clients) | $(ratio "$(f commands "d['applied_per_s']")" "$pg_command") | $(f commands "[v for v in d['verdicts'] if v[0] != 'applied'] or 'none'"), $(f commands "d['left']") without an outcome |"
  echo "| payouts accepted/s with no instance dispatching, 32 clients (p50 $(f payouts-accepted "round(d['accepted']['p50_ms'], 1)") ms, p99 $(f payouts-accepted "round(d['accepted']['p99_ms'], 1)") ms) | $(f payouts-accepted "round(d['accepted']['per_s'])") | $pg_payout (\`payout()\`, 32 clients) | $(ratio "$(f payouts-accepted "d['accepted']['per_s']")" "$pg_payout") | $(f payouts-accepted "d['accepted']['other_answers'] or 'none'") |"
  echo "| payouts the outbox sent per second, sustained: a backlog of $(f payouts-sent "d['sent']['backlog']") from the first sent to the last ($(f payouts-sent "round(d['sent']['seconds'], 1)") s) | $(f payouts-sent "round(d['sent']['per_s'])") | $pg_dispatch (\`payout_take()\` and \`payout_settle_all()\`, $dispatch_batch a batch, 1 client, no gateway) | $(ratio "$(f payouts-sent "d['sent']['per_s']")" "$pg_dispatch") | $(f payouts-sent "d['sent']['left_in_outbox']") left in the outbox |"
  echo "| the same, against the gateway simulator alone (32 clients) | $(f payouts-sent "round(d['sent']['per_s'])") | $(f payouts-sent "round(d['gateway_per_s'])") | $(ratio "$(f payouts-sent "d['sent']['per_s']")" "$(f payouts-sent "d['gateway_per_s']")") | |"
  echo
  echo "## What one accepted transfer costs outside PostgreSQL"
  echo
  echo "Measured over the 32-client throughput run by \`wallet-loadtest\` itself, from after its sign-ups to the end of"
  echo "the run, and divided by the transfers it saw accepted:"
  echo
  echo "| figure | per accepted transfer | target |"
  echo "|---|---|---|"
  echo "| server CPU (user + system, \`/proc/PID/stat\`), sign-ups excluded | $cpu_us µs | — |"
  echo "| the same, against one \`GET /healthz\` ($healthz_cpu_us µs, same server, same run) | $(ratio "$cpu_us" "$healthz_cpu_us")× | ≤ 5× |"
  echo "| the same, against one \`GET /healthz\` at the transfers' own pace ($paced_healthz_cpu_us µs at $paced_healthz_rps requests/s, same server, same run) | $(ratio "$cpu_us" "$paced_healthz_cpu_us")× | — |"
  echo "| the load generator's own CPU (\`wallet-loadtest\`, same run), against its $healthz_gen_cpu_us µs for one \`GET /healthz\` | $gen_cpu_us µs | — |"
  echo "| PostgreSQL round trips, on the wire (\`wallet-loadtest pg-wire\`: each \`Sync\` or simple \`Query\`; a separate run through the counter) | $pg_trips | < 1 batched |"
  echo "| transfers per call to PostgreSQL (\`wallet_transfer_batch_transfers\`, the 32-client run; calls by size: $batch_sizes) | $batch_mean | |"
  echo "| statement messages on the wire (a cached statement is a \`Bind\` and an \`Execute\`), the same run | $pg_messages | 2 |"
  echo "| Redis commands (\`INFO commandstats\`, commands run by scripts included: $redis_by_cmd) | $redis_cmds | ≤ 2 |"
  echo "| Redis round trips (the server's \`wallet_redis_round_trips_total\`, feed batches included) | $redis_trips | 1 on the request path |"
  echo "| PostgreSQL statements (\`pg_stat_database\` transactions: each statement is its own) | $pg_xacts | 1 |"
  echo
  echo "PostgreSQL transactions during the cooldown run: $((after - before)) for $cooldown_n rejected and $cooldown_accepted accepted"
  echo "requests (\`pg_stat_database.xact_commit + xact_rollback\`, read after the statistics flush): the rejections cost none."
  echo "One rejection cost $(per_refusal server_cpu_us) µs of the server's CPU and $(per_refusal load_generator_cpu_us) µs of the load"
  echo "generator's, against $(per_cooldown_healthz server_cpu_us) and $(per_cooldown_healthz load_generator_cpu_us) µs for one \`GET /healthz\` on the same server just before."
  echo
  echo "Invariant violations found by the load test across all runs: $violations."
  echo
  echo "## Commands"
  echo
  echo '```sh'
  echo "pgbench \"\$DB\" -n -M prepared -c {8,32,64} -j 2 -T $duration --max-tries=10 -D n=$wallets -D hot=0 -f loadtest/pgbench/transfer.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c 32 -j 2 -T $duration --max-tries=10 -D n=$wallets -D hot=1 -f loadtest/pgbench/transfer.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c {8,32,64} -j 2 -T $duration --max-tries=10 -D n={1000,100000,1000000} -D hot=0 -f loadtest/pgbench/transfer_fn.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c $executors -j $((executors < 2 ? executors : 2)) -T $duration --max-tries=10 -D n=$wallets -D hot=0 -f batch-SIZE.sql@CALLS …  # batch-SIZE.sql: '\\set batch SIZE', then loadtest/pgbench/transfer_batch_fn.sql; one per size the service formed"
  echo "pgbench \"\$DB\" -n -M prepared -c 32 -j 2 -T $duration --max-tries=10 -D n=$wallets -f loadtest/pgbench/replay_fn.sql  # after replay_setup.sql"
  echo "psql \"\$DB\" -v n=$wallets -v keys=$keys_at_size -f loadtest/pgbench/keys_fill.sql  # after setup.sql; then transfer_fn.sql at 32 clients, and the service"
  echo "redis-benchmark -q -c 32 -n 300000 -r 1000000 SET 'bench:cooldown:__rand_int__' token NX PX 5000"
  echo "WALLET_COOLDOWN_TTL_MS=1 wallet-server serve"
  echo "wallet-loadtest run healthz --concurrency 32 --duration-s $duration --server-pid PID"
  echo "wallet-loadtest run healthz --rate-per-s RATE --duration-s $duration --server-pid PID  # RATE: the 32-client transfers accepted/s"
  echo "wallet-loadtest run throughput --concurrency {8,32,128,512} --users {$users,$users,$users,1024} --duration-s $duration"
  echo "  # at 32: --server-pid PID --redis-url URL --metrics-url ADMIN/metrics --settle-ms 11000"
  echo "loadtest/wrk/sign_up.py URL $users > users.txt"
  echo "wrk -t2 -c32 -d${duration}s -s loadtest/wrk/transfers.lua URL -- users.txt"
  echo "wallet-loadtest pg-wire --listen 127.0.0.1:WIRE --upstream PGHOST:PGPORT --stats-listen 127.0.0.1:STATS"
  echo "DATABASE_URL=postgres://…@127.0.0.1:WIRE/DB?sslmode=disable WALLET_COOLDOWN_TTL_MS=1 wallet-server serve"
  echo "wallet-loadtest run throughput --concurrency 32 --users $users --pg-wire-url http://127.0.0.1:STATS/"
  echo "WALLET_COOLDOWN_TTL_MS=1 WALLET_TRANSFERS_BATCH_MAX=1 WALLET_TRANSFERS_CONNECTIONS=$unbatched_executors wallet-server serve"
  echo "wallet-loadtest run throughput --concurrency 32 --users $users --duration-s $duration"
  echo "wallet-loadtest run hot-wallet --concurrency 32 --users $users --duration-s $duration"
  echo "wallet-loadtest run replay --concurrency 32 --users 32 --duration-s $duration"
  echo "WALLET_COOLDOWN_TTL_MS=600000 wallet-server serve"
  echo "wallet-loadtest run healthz --concurrency 32 --duration-s $duration --server-pid PID  # the cooldown's ceiling, same server"
  echo "wallet-loadtest run throughput --concurrency 32 --users 2 --duration-s $duration --server-pid PID"
  echo "pgbench \"\$DB\" -n -M prepared -c 32 -j 2 -T $duration --max-tries=10 -D n=$wallets -f loadtest/pgbench/deposit_fn.sql  # after setup.sql, clearing_setup.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c $partitions -j 2 -T $duration --max-tries=10 -D n=$wallets -f loadtest/pgbench/command_fn.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c 32 -j 2 -T $duration --max-tries=10 -D n=$wallets -f loadtest/pgbench/payout_fn.sql"
  echo "pgbench \"\$DB\" -n -M prepared -c 1 -j 1 --max-tries=10 -t BATCHES -D batch=$dispatch_batch -f loadtest/pgbench/dispatch_fn.sql  # BATCHES: the outbox's rows / $dispatch_batch"
  echo "wallet-sim gateway --listen 127.0.0.1:PORT --database-url GATEWAY_DB"
  echo "WALLET_COOLDOWN_TTL_MS=1 WALLET_PAYOUT_GATEWAY_URL=http://127.0.0.1:PORT WALLET_PROVIDER_WEBHOOK_SECRETS=SECRET WALLET_COMMANDS_ENABLED=true WALLET_COMMANDS_PARTITIONS=$partitions wallet-server serve"
  echo "LOADTEST_PROVIDER_SECRET=SECRET wallet-loadtest deposits --concurrency 32 --users 64 --duration-s $duration"
  echo "wallet-loadtest commands --redis-prefix PREFIX --partitions $partitions --users 64 --commands $((duration * 300))"
  echo "WALLET_COOLDOWN_TTL_MS=1 WALLET_PAYOUT_GATEWAY_URL=http://127.0.0.1:PORT WALLET_PAYOUT_DISPATCHER_ENABLED=false wallet-server serve"
  echo "wallet-loadtest payouts --phase accept --gateway-url http://127.0.0.1:PORT --concurrency 32 --users 64 --duration-s $((duration * 3))"
  echo "WALLET_COOLDOWN_TTL_MS=1 WALLET_PAYOUT_GATEWAY_URL=http://127.0.0.1:PORT wallet-server serve"
  echo "wallet-loadtest payouts --phase send --gateway-url http://127.0.0.1:PORT --concurrency 32 --duration-s $duration"
  echo '```'
} > "$out.new"
if [ -f docs/benchmarks-analysis.md ]; then
  { echo; cat docs/benchmarks-analysis.md; } >> "$out.new"
fi
mv "$out.new" "$out"
loadtest/scaling_chart.py "$work" docs/scaling.svg \
    "8:${pg_fn_by_clients[8]},32:${pg_fn_by_clients[32]},64:${pg_fn_by_clients[64]}" \
    "1000:${pg_fn_by_wallets[1000]},100000:${pg_fn_by_wallets[100000]},1000000:${pg_fn_by_wallets[1000000]}"
cat "$out"
