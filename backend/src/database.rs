//! The PostgreSQL pools, each limit explicit, and the schema: the server's
//! pool, the owner's pool for migrations, and the migrations themselves.
//! The server (`startup`) and `wallet-server migrate` both start here.

use std::sync::Arc;

use secrecy::ExposeSecret;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

use crate::database_hosts::{self, DatabaseHosts, PoolMoves};
use crate::settings::Database;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../migrations");

/// Applies pending migrations, then fills in what a migration cannot
/// compute in SQL (the comparable names of older accounts). sqlx takes an
/// advisory lock, so instances starting together do not race on the schema.
pub async fn migrate(db: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(db).await.map_err(|error| match error {
        // Checked before anything is applied, so the database is untouched.
        sqlx::migrate::MigrateError::VersionMissing(version) => anyhow::anyhow!(
            "this database was made by an earlier build: it records migration {version}, which the schema's \
             baseline no longer has (migrations/README.md). Nothing was changed. Drop the database and create \
             it empty, or point DATABASE_URL at a new one; ./scripts/serve does this for its own local database"
        ),
        sqlx::migrate::MigrateError::VersionMismatch(version) => anyhow::anyhow!(
            "this database was made by an earlier build: its migration {version} differs from the schema's \
             baseline of that number (migrations/README.md). Nothing was changed. Drop the database and create \
             it empty, or point DATABASE_URL at a new one; ./scripts/serve does this for its own local database"
        ),
        error => anyhow::anyhow!("failed to apply migrations: {error}"),
    })?;
    crate::names::backfill(db)
        .await
        .map_err(|error| anyhow::anyhow!("failed to fill in the comparable names: {error}"))
}

/// A PostgreSQL pool with every limit explicit, as the server's role.
/// Connects lazily.
pub fn db_pool(database: &Database) -> anyhow::Result<PgPool> {
    pool_for(database, database.url.expose_secret(), "database_url")
}

/// A pool as the owning role, for migrations: `database_migration_url`,
/// or `database_url` when that is empty.
pub fn migration_pool(database: &Database) -> anyhow::Result<PgPool> {
    let url = database.migration_url.expose_secret();
    if url.is_empty() {
        db_pool(database)
    } else {
        pool_for(database, url, "database_migration_url")
    }
}

fn pool_for(database: &Database, url: &str, setting: &str) -> anyhow::Result<PgPool> {
    let statement_timeout = format!("{}ms", database.statement_timeout.as_millis());
    let hosts = DatabaseHosts::parse(url)
        .map_err(|why| anyhow::anyhow!("{setting} is not a valid PostgreSQL URL: {why}"))?
        .map(|server| {
            server
                .application_name("layered-wallet")
                .options([("statement_timeout", statement_timeout.as_str())])
        });
    let writes_required = hosts.writes_required();
    let moves = Arc::new(PoolMoves::default());
    let moves_at_checkout = moves.clone();
    let check_idle_after = database.idle_check_after;
    let pool = PgPoolOptions::new()
        .max_connections(database.pool_connections_max)
        .min_connections(database.pool_connections_min)
        .acquire_timeout(database.acquire_wait_max)
        // `target_session_attrs=read-write`: a server that only reads (a
        // standby, a demoted primary) is refused, as libpq would.
        .after_connect(move |connection, _| {
            Box::pin(async move {
                if writes_required && !database_hosts::accepts_writes(connection).await? {
                    return Err(sqlx::Error::Protocol(
                        "the server takes no writes (target_session_attrs=read-write)".into(),
                    ));
                }
                Ok(())
            })
        })
        // A connection that broke while idle (a restart, a proxy's idle
        // timeout) must be found before a transfer is sent down it, or
        // the client is told "outcome unknown" where nothing was sent. The
        // check costs a round trip, so a deployment whose connections do
        // not break while idle may skip it for connections used within
        // `db_idle_check_after_ms` (0, the default: always check). One
        // opened before the pool moved to another server is closed.
        .test_before_acquire(false)
        .before_acquire(move |connection, meta| {
            let left_behind = moves_at_checkout.predates_last_move(meta.age);
            Box::pin(async move {
                if left_behind {
                    return Ok(false);
                }
                if check_idle_after.is_zero() || meta.idle_for >= check_idle_after {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        })
        .connect_lazy_with(hosts.first());
    if hosts.has_alternatives() {
        database_hosts::watch(pool.clone(), hosts, moves, database.host_watch);
    }
    Ok(pool)
}
