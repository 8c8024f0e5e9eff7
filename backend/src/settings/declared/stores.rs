//! The settings of the stores: PostgreSQL's pools, waits and timeouts,
//! and Redis's connection.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! stores_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "PostgreSQL" {
                /// The database as the server's role. `sslmode` in it is honoured
                /// (TLS by rustls, with the system's CA roots). It may name several
                /// servers, as libpq's URLs do (`postgres://role@db1:5432,db2:5432/wallet`);
                /// with `target_session_attrs=read-write` the pool uses the one that
                /// takes writes and follows it through a failover
                /// (`db_host_check_interval_ms`).
                database_url: SecretString = SecretString::from("postgres://postgres@127.0.0.1:5432/layered_wallet");
                /// The database as its owning role, for migrations only
                /// (`wallet-server migrate`, `migrate_on_start`). Empty: `database_url`.
                /// The server itself should connect as a role that may only read and
                /// write rows and call functions (`deploy/postgres/roles.sql`).
                database_migration_url: SecretString = SecretString::from(""), empty "`database_url`";
                /// Most connections the PostgreSQL pool holds.
                db_pool_connections_max: u32 = 16, within 1..=1_000 "connections";
                /// Connections the PostgreSQL pool keeps open even when idle; at most
                /// `db_pool_connections_max`.
                db_pool_connections_min: u32 = 2, within 0..=1_000 "connections";
                /// How long a request waits for a free connection before answering 503.
                db_acquire_wait_ms_max: u64 = 2_000, within 1..=60_000 "ms";
                /// A pooled connection idle at least this long is pinged before use;
                /// one used more recently is not. 0 (the default) pings on every
                /// checkout: a round trip per transfer, but a connection that broke
                /// while idle is replaced before a transfer is sent down it, so the
                /// client gets a clean answer instead of "outcome unknown".
                db_idle_check_after_ms: u64 = 0, within 0..=3_600_000 "ms";
                /// PostgreSQL `statement_timeout`. It must exceed the waits a transfer
                /// statement encloses (`idempotency_wait_ms_max` +
                /// `wallet_lock_wait_ms_max` + `STATEMENT_TIMEOUT_MARGIN_MS`), so that
                /// each wait ends in its own answer (409, 503) rather than the timeout.
                db_statement_timeout_ms: u64 = 6_000, within 1..=600_000 "ms";
                /// When `database_url` names several servers (`host1:5432,host2:5432`),
                /// how often the server in use is asked whether it still answers, and
                /// with `target_session_attrs=read-write` whether it still takes writes.
                /// After a failover the pool moves within about this long of the
                /// promotion. Unused with one server.
                db_host_check_interval_ms: u64 = 500, within 50..=60_000 "ms";
                /// Longest wait for a server to accept a connection and answer that
                /// check, before the next server in `database_url` is tried.
                db_host_connect_wait_ms_max: u64 = 1_000, within 10..=60_000 "ms";
                /// Transfers that may run at once on this instance: waiting for a
                /// transfer executor or inside its call. The executors carry at most
                /// `transfers_connections` × `transfers_batch_max` (16) at once; the
                /// rest wait in their queue, ready to fill the next call. Fewer
                /// leaves the batches short.
                transfers_in_flight_max: u32 = 64, within 1..=10_000 "transfers";
                /// Transfers that may wait for one of those places; one that finds
                /// this queue full is refused at once with 503
                /// `/problems/overloaded` and `Retry-After`, having changed nothing.
                /// About `transfers_in_flight_max`: enough that a place freed is
                /// taken at once, while under overload a refusal costs no wait.
                transfers_admission_queue_max: u32 = 64, within 0..=10_000 "transfers";
                /// How long a queued transfer waits for a place before it is
                /// refused the same way. Short, and under `db_acquire_wait_ms_max`:
                /// load past what the database can take is refused at once, instead
                /// of queueing until it times out.
                transfers_admission_wait_ms_max: u64 = 50, within 0..=60_000 "ms";
                /// Connections the transfer executors hold, one each, taken from the
                /// pool and kept: a transfer is one round trip on one of them, with
                /// no check before or after it. Shared out among the HTTP workers,
                /// each running its executors on its own thread, so at least
                /// `http_workers`. The rest of the pool serves every other path, so
                /// this must stay under `db_pool_connections_max`. One is the
                /// default: a lone executor takes everything that waited while its
                /// last call ran, so its calls are the fullest and the fewest, and
                /// on two cores it accepted as many transfers as four executors with
                /// a third less CPU per transfer (`docs/benchmarks-analysis.md`).
                transfers_connections: u32 = 1, within 1..=1_000 "connections";
                /// Most transfers one executor sends to PostgreSQL in one call
                /// (`transfer_batch()`), taken from those waiting when it is free; it
                /// never waits for more. 1: each transfer in a call of its own
                /// (`transfer()`). At most 32: each transfer of a batch writes in two
                /// subtransactions (its claim, its guard), and past the 64 a transaction
                /// keeps in shared memory every snapshot in the database slows down.
                transfers_batch_max: u32 = 16, within 1..=32 "transfers";
                /// An executor's connection unused this long is checked (one round
                /// trip) before a transfer is sent down it, so that one that broke
                /// while idle is replaced and the client gets a clean answer instead
                /// of "outcome unknown". Under load the connections are never this
                /// idle, and no transfer waits for a check.
                transfers_idle_check_after_ms: u64 = 1_000, within 0..=3_600_000 "ms";
                /// Longest wait for a wallet row lock held by another transfer. This
                /// and the idempotency wait and retention are `u16`: they go to
                /// PostgreSQL as `int`, and the type makes that conversion total.
                wallet_lock_wait_ms_max: u16 = 3_000, within 1..=60_000 "ms";
                /// Retries of a transfer transaction that failed on a serialization
                /// failure or a deadlock; never surfaced to the client as a 500.
                transfer_retries_max: u32 = 3, within 0..=10 "retries";
                /// Run pending migrations when the server starts.
                migrate_on_start: bool = true;
            }

            section "Redis" {
                /// The Redis server of the cooldown, the account limits and the
                /// decision feed.
                redis_url: SecretString = SecretString::from("redis://127.0.0.1:6379");
                /// Commands in flight at once on one Redis connection (each thread that
                /// uses Redis has its own); further ones wait (within
                /// `redis_command_timeout_ms`).
                redis_commands_in_flight_max: usize = 1_024, within 1..=100_000 "commands";
                /// Upper bound on one Redis command, connecting included. A slow Redis is
                /// treated like an unreachable one.
                redis_command_timeout_ms: u64 = 250, within 1..=60_000 "ms";
                /// Nodes of a Redis Cluster to use instead of `redis_url` (any subset;
                /// the rest are discovered). Empty: one Redis server at `redis_url`.
                redis_cluster_urls: Vec<SecretString> = Vec::new(), empty "one Redis server at `redis_url`";
                /// Prepended to every Redis key, so several deployments (or tests) can
                /// share one Redis.
                redis_key_prefix: String = "lw:".into();
            }

        }
    };
}

pub(super) use stores_settings;
