# shellcheck shell=bash
# Sourced by scripts/serve and scripts/test: makes PostgreSQL and Redis
# reachable on 127.0.0.1, installing them from Debian's packages and
# starting them when they are not, and exports:
#   PG_SERVER_URL  a URL of the PostgreSQL server (database "postgres")
#   REDIS_URL      the Redis URL
#
# Respected when set: PG_SERVER_URL, REDIS_URL. Nothing is changed on a
# machine where both already answer.

PG_PORT=${PG_PORT:-5432}
REDIS_PORT=${REDIS_PORT:-6379}
STATE_DIR=${STATE_DIR:-"$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/.tmp"}
_APT_UPDATED=

log() { printf 'services: %s\n' "$*" >&2; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

wait_for_port() {
  local port=$1 what=$2
  for _ in $(seq 1 100); do
    port_open "$port" && return 0
    sleep 0.1
  done
  log "$what did not come up on 127.0.0.1:$port"
  return 1
}

apt_install() {
  log "installing $* from Debian's packages"
  export DEBIAN_FRONTEND=noninteractive
  if [ -z "$_APT_UPDATED" ]; then
    as_root apt-get update -qq
    _APT_UPDATED=1
  fi
  as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

ensure_redis() {
  REDIS_URL=${REDIS_URL:-"redis://127.0.0.1:$REDIS_PORT"}
  export REDIS_URL
  port_open "$REDIS_PORT" && return 0
  command -v redis-server >/dev/null || apt_install redis-server
  # The package may have started its own server.
  port_open "$REDIS_PORT" && return 0
  log "starting Redis on 127.0.0.1:$REDIS_PORT"
  mkdir -p "$STATE_DIR/redis"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no \
    --maxmemory-policy noeviction --dir "$STATE_DIR/redis" --logfile "$STATE_DIR/redis/redis.log"
  wait_for_port "$REDIS_PORT" Redis
}

start_debian_cluster() {
  local version cluster
  if [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
    read -r version cluster _ < <(pg_lsclusters -h | head -n 1)
  else
    version=$(ls /usr/lib/postgresql | sort -V | tail -n 1)
    cluster=main
    log "creating PostgreSQL cluster $version/$cluster"
    as_root pg_createcluster "$version" "$cluster" --port "$PG_PORT" >/dev/null
  fi
  log "starting PostgreSQL $version/$cluster"
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start
}

ensure_postgres() {
  if ! port_open "$PG_PORT"; then
    compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || apt_install postgresql
    port_open "$PG_PORT" || start_debian_cluster
    wait_for_port "$PG_PORT" PostgreSQL
  fi
  command -v psql >/dev/null || apt_install postgresql-client

  if [ -n "${PG_SERVER_URL:-}" ]; then
    psql "$PG_SERVER_URL" -Atqc 'SELECT 1' >/dev/null && { export PG_SERVER_URL; return 0; }
    log "cannot log in with PG_SERVER_URL"
    return 1
  fi
  local trust="postgres://postgres@127.0.0.1:$PG_PORT/postgres"
  local password="postgres://postgres:postgres@127.0.0.1:$PG_PORT/postgres"
  for url in "$trust" "$password"; do
    if PGCONNECT_TIMEOUT=3 psql "$url" -Atqc 'SELECT 1' >/dev/null 2>&1; then
      export PG_SERVER_URL=$url
      return 0
    fi
  done
  # A stock Debian cluster asks for a password over TCP and has none set:
  # give the local superuser the well-known development password.
  log "setting a development password for the local postgres role"
  as_root su postgres -c "psql -qc \"ALTER ROLE postgres PASSWORD 'postgres'\"" >/dev/null
  export PG_SERVER_URL=$password
  psql "$PG_SERVER_URL" -Atqc 'SELECT 1' >/dev/null
}

# The URL of database $1 on the same server.
database_url() {
  printf '%s/%s' "${PG_SERVER_URL%/*}" "$1"
}

ensure_database() {
  local name=$1
  # A local database made by an earlier build records migrations that the
  # schema's baseline no longer has (migrations/README.md), and the server
  # would refuse it. It holds only local test data: make it again.
  local known stale
  # Each migration as sqlx records it: its version and the SHA-384 of its
  # text. A recorded migration that is not one of these is stale.
  known=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../migrations" &&
    for file in *.sql; do printf "(%s,'%s'::bytea)," "${file%%_*}" "\\x$(sha384sum "$file" | cut -d' ' -f1)"; done)
  stale=$(psql "$(database_url "$name")" -Atqc "SELECT count(*) FROM _sqlx_migrations m
      WHERE (m.version, m.checksum) NOT IN (VALUES ${known%,})" 2>/dev/null || true)
  if [ -n "$stale" ] && [ "$stale" != 0 ]; then
    log "database $name was made by an earlier build's migrations; making it again"
    psql "$PG_SERVER_URL" -qc "DROP DATABASE $name WITH (FORCE)" >/dev/null
  fi
  if [ "$(psql "$PG_SERVER_URL" -Atqc "SELECT 1 FROM pg_database WHERE datname = '$name'")" != 1 ]; then
    log "creating database $name"
    psql "$PG_SERVER_URL" -qc "CREATE DATABASE $name" >/dev/null
  fi
}

# The deployment's two roles on database $1 (deploy/postgres/roles.sql):
# the owner, which the migrations run as, and the server's role, which may
# only read and write rows and call functions. Their passwords are made
# once and kept in .tmp/. Exports DATABASE_URL (the server's role) and
# DATABASE_MIGRATION_URL (the owner), unless DATABASE_URL is set already.
ensure_roles() {
  local database=$1 owner=${1}_owner app=${1}_app
  [ -n "${DATABASE_URL:-}" ] && return 0
  mkdir -p "$STATE_DIR"
  local secret
  for secret in owner app; do
    [ -s "$STATE_DIR/db-$secret-password" ] ||
      head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$STATE_DIR/db-$secret-password"
  done
  local owner_password app_password
  owner_password=$(cat "$STATE_DIR/db-owner-password")
  app_password=$(cat "$STATE_DIR/db-app-password")
  psql "$PG_SERVER_URL" -X -q -v database="$database" \
    -v owner_role="$owner" -v owner_password="$owner_password" \
    -v app_role="$app" -v app_password="$app_password" \
    -f "$(dirname "${BASH_SOURCE[0]}")/../../deploy/postgres/roles.sql" >/dev/null
  local server=${PG_SERVER_URL#*@}
  server=${server%/*}
  export DATABASE_URL="postgres://$app:$app_password@$server/$database"
  export DATABASE_MIGRATION_URL="postgres://$owner:$owner_password@$server/$database"
}

ensure_services() {
  ensure_postgres
  ensure_redis
}

# A local Redis Cluster of three masters on 127.0.0.1:7101-7103, for the
# cluster tests and for trying `redis_cluster_urls`. Exports
# REDIS_CLUSTER_URLS.
REDIS_CLUSTER_PORTS=${REDIS_CLUSTER_PORTS:-"7101 7102 7103"}

ensure_redis_cluster() {
  local first urls="" port
  first=${REDIS_CLUSTER_PORTS%% *}
  for port in $REDIS_CLUSTER_PORTS; do urls="${urls:+$urls,}redis://127.0.0.1:$port"; done
  export REDIS_CLUSTER_URLS=$urls
  if port_open "$first" && redis-cli -p "$first" cluster info 2>/dev/null | grep -q 'cluster_state:ok'; then
    return 0
  fi
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null || apt_install redis-tools
  log "starting a Redis Cluster on ports $REDIS_CLUSTER_PORTS"
  for port in $REDIS_CLUSTER_PORTS; do
    port_open "$port" && continue
    mkdir -p "$STATE_DIR/redis-cluster/$port"
    redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file "nodes-$port.conf" --cluster-node-timeout 2000 \
      --maxmemory-policy noeviction \
      --dir "$STATE_DIR/redis-cluster/$port" --logfile "$STATE_DIR/redis-cluster/$port/redis.log"
    wait_for_port "$port" "Redis Cluster node"
  done
  if ! redis-cli -p "$first" cluster info | grep -q 'cluster_known_nodes:3'; then
    local nodes=""
    for port in $REDIS_CLUSTER_PORTS; do nodes="$nodes 127.0.0.1:$port"; done
    # shellcheck disable=SC2086
    redis-cli --cluster create $nodes --cluster-replicas 0 --cluster-yes >/dev/null
  fi
  for _ in $(seq 1 100); do
    redis-cli -p "$first" cluster info | grep -q 'cluster_state:ok' && return 0
    sleep 0.1
  done
  log "the Redis Cluster did not become ready"
  return 1
}

# The chaos suite and the security tests start PostgreSQL clusters and
# Redis servers of their own (one with a self-signed certificate), and the
# failover runs a replicated PostgreSQL under Patroni and a Redis Cluster
# with replicas, so they need the programs even where the servers run
# elsewhere.
ensure_store_programs() {
  compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null || apt_install postgresql
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null || apt_install redis-tools
  command -v openssl >/dev/null || apt_install openssl
  command -v runuser >/dev/null || apt_install util-linux
  # The failover runs: a primary and a standby under Patroni, with etcd.
  command -v patroni >/dev/null || apt_install patroni
  command -v etcd >/dev/null || apt_install etcd-server
}
