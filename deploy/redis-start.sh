#!/bin/sh
# Starts redis-server with one of deploy/redis*.conf, its users' passwords
# filled in from the environment, so that no password is committed:
#
#   REDIS_WALLET_PASSWORD=… [REDIS_BROKER_PASSWORD=…] \
#     deploy/redis-start.sh deploy/redis-commands.conf [redis-server options]
#
# Each password the file names must be set: 32 or more letters, digits, -
# or _ (e.g. openssl rand -hex 32). That alphabet keeps a password one word
# in the ACL and plain text for sed. The filled-in copy is written to
# REDIS_CONF_OUT (/tmp/redis.conf), readable by its owner only.
set -eu
conf=${1:?usage: redis-start.sh CONFIG_FILE [redis-server options]}
shift
out=${REDIS_CONF_OUT:-/tmp/redis.conf}
script=""
for name in REDIS_WALLET_PASSWORD REDIS_BROKER_PASSWORD; do
  grep -q "\${$name}" "$conf" || continue
  eval "value=\${$name:-}"
  case $value in
    *[!A-Za-z0-9_-]*)
      echo "redis-start.sh: $name may hold only letters, digits, - and _" >&2
      exit 1
      ;;
  esac
  if [ "${#value}" -lt 32 ]; then
    echo "redis-start.sh: set $name (32 or more characters, e.g. openssl rand -hex 32); $conf needs it" >&2
    exit 1
  fi
  script="$script s/\${$name}/$value/g;"
done
(umask 077 && sed -e "$script" "$conf" > "$out")
exec redis-server "$out" "$@"
