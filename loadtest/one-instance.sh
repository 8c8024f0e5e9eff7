# shellcheck shell=bash
# Sourced by loadtest/overload.sh and loadtest/retry-storm.sh: one release
# instance on stores of its own, with the machine's CPUs split between the
# service and the load generator.
#
#   build_release
#   start_private_stores            # PostgreSQL and Redis; sets db_url
#   start_instance NAME PORT        # sets server_pid; logs to $work
#   "${on_loadtest_cpus[@]}" COMMAND...   # runs the load generator
#   reset_peak_rss; ...; peak_rss_kib
#   stop_private_stores             # the caller's EXIT trap
#
# The instance has a 1 ms cooldown: the window never holds back a user's
# next transfer, so what a run meets is the database and the admission
# limit.
#
# Why the CPUs are split: driving an instance at four times its rate takes
# the load generator about as much CPU as the instance needs to refuse
# what it cannot serve. On a machine shared by both, the generator's work
# is taken from PostgreSQL, and a goodput figure measures the generator as
# much as the service. So the service (PostgreSQL, Redis and the server)
# runs on SERVICE_CPUS and the generator on LOADTEST_CPUS (`taskset`):
# every phase gives the service the same CPUs, as clients on other
# machines would. By default the generator has the last CPU and the
# service the others; SPLIT_CPUS=0 shares them all, to compare.
#
# The stores are private (initdb + pg_ctl, redis-server, on free ports in
# a scratch directory), because pinning is a change to a server's
# processes, and the machine's own servers are never changed. The script
# stops only what it started, by its data directory and pid.

build_release() {
  cargo build --release -p layered-wallet -p wallet-loadtest --bins >&2
  server=target/release/wallet-server
  loadtest=target/release/wallet-loadtest
}

cpus=$(nproc)
if [ "${SPLIT_CPUS:-1}" = 1 ] && [ "$cpus" -ge 2 ]; then
  SERVICE_CPUS=${SERVICE_CPUS:-0-$((cpus - 2))}
  LOADTEST_CPUS=${LOADTEST_CPUS:-$((cpus - 1))}
  # Command prefixes, not functions: `taskset` execs the command, so a
  # background one's $! is the command's own pid.
  on_service_cpus=(taskset -c "$SERVICE_CPUS")
  on_loadtest_cpus=(taskset -c "$LOADTEST_CPUS")
  echo "CPUs: the service on $SERVICE_CPUS, the load generator on $LOADTEST_CPUS" >&2
else
  on_service_cpus=()
  on_loadtest_cpus=()
  echo "CPUs: the service and the load generator share all $cpus" >&2
fi

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# PostgreSQL's own binaries refuse to run as root: as root, they run as
# the postgres user.
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

server_pid=
private_redis_pid=
scratch=

# Starts the private PostgreSQL and Redis on the service's CPUs, creates
# the database, and writes $scratch/up and $scratch/down: the commands
# that start PostgreSQL again and stop it as a crash would (`-m
# immediate`), for runs that take it away.
start_private_stores() {
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || apt_install postgresql
  command -v redis-server >/dev/null || apt_install redis-server
  local pg_bin pg_port redis_port
  pg_bin=$(dirname "$(compgen -G "/usr/lib/postgresql/*/bin/initdb" | sort -V | tail -n 1)")
  scratch=$(mktemp -d /tmp/wallet-loadtest.XXXXXX)
  [ "$(id -u)" = 0 ] && chown postgres:postgres "$scratch"
  pg_port=$(free_port)
  as_postgres "$pg_bin/initdb" -D "$scratch/data" -U postgres --auth=trust -E UTF8 >/dev/null
  local as_postgres_prefix=
  [ "$(id -u)" = 0 ] && as_postgres_prefix="runuser -u postgres -- "
  # The children PostgreSQL forks keep the postmaster's CPUs.
  cat > "$scratch/up" <<UP
#!/bin/sh
${on_service_cpus[*]:+${on_service_cpus[*]} }$as_postgres_prefix"$pg_bin/pg_ctl" -D "$scratch/data" -w -l "$scratch/postgres.log" \
  -o "-p $pg_port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$scratch/data -c max_connections=200 -c log_checkpoints=on -c log_autovacuum_min_duration=0 -c log_line_prefix='%m '" start >/dev/null
UP
  cat > "$scratch/down" <<DOWN
#!/bin/sh
$as_postgres_prefix"$pg_bin/pg_ctl" -D "$scratch/data" -m immediate stop >/dev/null
DOWN
  chmod 755 "$scratch/up" "$scratch/down"
  "$scratch/up"
  psql "postgres://postgres@127.0.0.1:$pg_port/postgres" -qc "CREATE DATABASE layered_wallet" >/dev/null
  db_url="postgres://postgres@127.0.0.1:$pg_port/layered_wallet"

  redis_port=$(free_port)
  "${on_service_cpus[@]}" redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
      --dir "$scratch" > "$scratch/redis.log" 2>&1 &
  private_redis_pid=$!
  REDIS_URL="redis://127.0.0.1:$redis_port"
  wait_for_port "$redis_port" Redis
}

stop_private_stores() {
  [ -n "$server_pid" ] && { kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; }
  [ -n "$private_redis_pid" ] && { kill "$private_redis_pid" 2>/dev/null || true; wait "$private_redis_pid" 2>/dev/null || true; }
  if [ -n "$scratch" ]; then
    "$scratch/down" 2>/dev/null || true
    # Kept for a run's reader: when a checkpoint or an autovacuum ran,
    # against the phases' times.
    cp "$scratch/postgres.log" "$work/postgres.log" 2>/dev/null || true
    rm -rf "$scratch"
  fi
}

start_instance() {
  local name=$1 port=$2
  local taken
  for taken in "$port" $((port + 1)); do
    if port_open "$taken"; then
      echo "port $taken is already in use; choose another pair of ports for $name" >&2
      exit 1
    fi
  done
  "${on_service_cpus[@]}" env DATABASE_URL="$db_url" REDIS_URL="$REDIS_URL" PORT="$port" RUST_LOG=warn \
      WALLET_ADMIN_HTTP_ADDR="127.0.0.1:$((port + 1))" WALLET_ACCOUNT_LIMITS_ENABLED=false \
      WALLET_TOKEN_SIGNING_KEY="$name-signing-key-$name-signing-key" \
      WALLET_REDIS_KEY_PREFIX="$name:" WALLET_COOLDOWN_TTL_MS=1 \
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
