#!/bin/sh
# Run once by the postgres image when it creates its data directory
# (/docker-entrypoint-initdb.d): the image's user owns the database and runs
# the migrations; the instances connect as wallet_app, which may only read
# and write rows and call functions (roles.sql).
set -eu
psql -X -q --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v database="$POSTGRES_DB" \
  -v owner_role="$POSTGRES_USER" -v owner_password="$POSTGRES_PASSWORD" \
  -v app_role=wallet_app -v app_password="$WALLET_APP_DB_PASSWORD" \
  -f /docker-entrypoint-initdb.d/roles.sql.in
