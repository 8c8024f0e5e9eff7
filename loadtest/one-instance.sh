# Sourced by loadtest/overload.sh and loadtest/retry-storm.sh: one release
# instance, built, on a port pair checked free first, with a 1 ms cooldown
# (the window never holds back a user's next transfer, so what a run meets
# is the database and the admission limit), and its peak RSS per phase.
#
#   build_release
#   start_instance NAME PORT DATABASE_URL   # sets server_pid; logs to $work
#   reset_peak_rss; ...; peak_rss_kib
#
# The caller stops the instance (kill "$server_pid") in its own EXIT trap.

build_release() {
  cargo build --release -p layered-wallet -p wallet-loadtest --bins >&2
  server=target/release/wallet-server
  loadtest=target/release/wallet-loadtest
}

start_instance() {
  local name=$1 port=$2 url=$3
  local taken
  for taken in "$port" $((port + 1)); do
    if port_open "$taken"; then
      echo "port $taken is already in use; choose another pair of ports for $name" >&2
      exit 1
    fi
  done
  env DATABASE_URL="$url" REDIS_URL="$REDIS_URL" PORT="$port" RUST_LOG=warn \
      WALLET_ADMIN_HTTP_ADDR="127.0.0.1:$((port + 1))" WALLET_ACCOUNT_LIMITS_ENABLED=false \
      WALLET_TOKEN_SIGNING_KEY="$name-signing-key-$name-signing-key" \
      WALLET_REDIS_KEY_PREFIX="$name:$(date +%s%N):" WALLET_COOLDOWN_TTL_MS=1 \
      "$server" serve > "$work/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 300); do curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "the server did not start; see $work/server.log" >&2
  exit 1
}

# Writing 5 to clear_refs resets the process's high-water mark, so that
# each phase's peak is its own.
reset_peak_rss() { echo 5 > "/proc/$server_pid/clear_refs"; }
peak_rss_kib() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$server_pid/status"; }
