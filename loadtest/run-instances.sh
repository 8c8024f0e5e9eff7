#!/usr/bin/env bash
# Starts N wallet-server instances on one PostgreSQL and one Redis, on
# ports 8081, 8082, … (admin listeners on 9091, 9092, …), for
# multi-instance load tests; `stop` stops them.
#
#   loadtest/run-instances.sh 3        # start three, print their URLs
#   loadtest/run-instances.sh stop     # stop them
#
# Stdout carries only the instances' URLs, one per line; everything else
# goes to stderr. A port that is already taken is an error that names it:
# an answer there would otherwise be mistaken for a new instance's.
#
# PROFILE=release uses an optimised build. Any WALLET_* variable is passed
# through, e.g. WALLET_COOLDOWN_TTL_MS=1 for a throughput benchmark.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
pids_file=.tmp/instances.pids
mkdir -p .tmp

stop() {
  [ -f "$pids_file" ] || return 0
  while read -r pid; do
    kill "$pid" 2>/dev/null || true
  done < "$pids_file"
  while read -r pid; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done < "$pids_file"
  rm -f "$pids_file"
}

if [ "${1:-}" = stop ]; then
  stop
  echo "instances stopped"
  exit 0
fi

count=${1:-2}
base_port=${BASE_PORT:-8081}
base_admin_port=${BASE_ADMIN_PORT:-9091}
. scripts/lib/services.sh
ensure_services
ensure_database layered_wallet
ensure_roles layered_wallet
[ -s .tmp/dev-signing-key ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > .tmp/dev-signing-key
export WALLET_TOKEN_SIGNING_KEY=${WALLET_TOKEN_SIGNING_KEY:-$(cat .tmp/dev-signing-key)}

# Load tests sign up thousands of users from this one address, which the
# sign-up limits exist to stop; set WALLET_ACCOUNT_LIMITS_ENABLED=true to
# keep them.
export WALLET_ACCOUNT_LIMITS_ENABLED=${WALLET_ACCOUNT_LIMITS_ENABLED:-false}

profile=${PROFILE:-debug}
cargo build --workspace --bins $([ "$profile" = release ] && echo --release) >&2
stop
for i in $(seq 1 "$count"); do
  for taken in $((base_port + i - 1)) $((base_admin_port + i - 1)); do
    if port_open "$taken"; then
      echo "port $taken is already in use; stop what listens there, or set BASE_PORT / BASE_ADMIN_PORT" >&2
      exit 1
    fi
  done
done
# Migrate once, so that the instances do not start by racing on the schema.
"target/$profile/wallet-server" migrate >&2
for i in $(seq 1 "$count"); do
  port=$((base_port + i - 1))
  PORT=$port WALLET_ADMIN_HTTP_ADDR="127.0.0.1:$((base_admin_port + i - 1))" \
    WALLET_INSTANCE_ID="instance-$i" WALLET_MIGRATE_ON_START=false \
    "target/$profile/wallet-server" serve > ".tmp/instance-$i.log" 2>&1 &
  echo $! >> "$pids_file"
done
for i in $(seq 1 "$count"); do
  port=$((base_port + i - 1))
  for _ in $(seq 1 100); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null || { echo "instance $i did not start; see .tmp/instance-$i.log" >&2; stop; exit 1; }
  echo "instance $i: http://127.0.0.1:$port (admin: http://127.0.0.1:$((base_admin_port + i - 1))/metrics)" >&2
  echo "http://127.0.0.1:$port"
done
