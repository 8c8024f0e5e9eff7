//! Every setting, declared once: its doc comment, name, type, default and,
//! for a number, its bounds and unit. `Settings`, its `Default`, the bound
//! checks and `docs/settings.md` all follow from this list
//! (`declare.rs`). A limit's unit is the last word of its name, or the
//! word before `_max` / `_min`; the names are the contract with config
//! files and `WALLET_*` variables.
//!
//! Rules that tie one setting to another, or that a string must follow,
//! are code in `sections.rs`.

use secrecy::SecretString;

use super::declare::declare_settings;
use super::{
    CooldownScope, IdempotencyMode, InboxMode, LogFormat, PayoutMode, RowGuardMode, StoreErrorPolicy,
};

declare_settings! {
    section "HTTP" {
        /// Address the public listener binds to.
        http_host: String = "127.0.0.1".into();
        /// Port of the public listener.
        http_port: u16 = 8080, within 0..=65_535 "port";
        /// `host:port` of the admin listener: `/metrics` and the detailed
        /// `/readyz`. Keep it off the public network; port 0 picks a free one.
        admin_http_addr: String = "127.0.0.1:9090".into();
        /// actix worker threads; one per core is enough for an I/O-bound service.
        http_workers: usize = 2, within 1..=256 "workers";
        /// Connections each worker holds open at once. Past it, the
        /// listeners stop accepting until one closes, and new connections
        /// wait in the kernel's backlog: idle keep-alive connections cannot
        /// take the process's memory and file descriptors without bound.
        http_connections_per_worker_max: usize = 10_000, within 1..=100_000 "connections";
        /// New connections the kernel queues for each listener until the
        /// server accepts them (`listen(2)`'s backlog). A burst past it is
        /// dropped at the door, and its clients try again 1 s later, then
        /// 3 s: a copy of a transfer can then arrive after its cooldown
        /// window and pay again. The kernel lowers it to
        /// `net.core.somaxconn` (4096 on Linux since 5.4); a larger value
        /// starts with a warning that names both.
        http_listen_backlog_connections: u32 = 2_048, within 1..=65_535 "connections";
        /// How long an idle keep-alive connection is kept open for its
        /// next request; 0 closes each connection after its response. A
        /// proxy in front must let its idle connections go sooner (nginx's
        /// `keepalive_timeout` in deploy/nginx is 4 s), or it may send a
        /// request on a connection being closed.
        http_keep_alive_s: u64 = 5, within 0..=3_600 "s";
        /// How long a new connection has to send a whole request head; one
        /// that sends it slower gets 408 and is closed, so that trickling
        /// headers cannot hold a connection.
        http_request_head_wait_ms_max: u64 = 5_000, within 100..=60_000 "ms";
        /// How long a request's body has, from the end of its head, to
        /// arrive whole; one that is slower gets 408 and its connection is
        /// closed, so that a body trickled in cannot hold a connection.
        http_request_body_wait_ms_max: u64 = 10_000, within 100..=300_000 "ms";
        /// Largest request body accepted; a larger one gets 413.
        request_body_bytes_max: usize = 16 * 1024, within 256..=(1024 * 1024) "bytes";
        /// An oversized body is read and thrown away up to this many bytes
        /// before the 413 is sent and the connection closed, so that a client
        /// still sending its body reads the answer instead of a reset.
        oversized_body_drain_bytes_max: usize = 8 * 1024 * 1024,
            within 0..=(256 * 1024 * 1024) "bytes";
        /// How long an oversized body is drained at most (see
        /// `oversized_body_drain_bytes_max`).
        oversized_body_drain_ms_max: u64 = 2_000, within 0..=60_000 "ms";
        /// How long in-flight requests get to finish after SIGTERM or
        /// SIGINT. New connections are refused at once, and each answer in
        /// the meantime closes its connection. Keep it above `http_keep_alive_s`,
        /// so that idle connections are closed by their keep-alive, which
        /// clients expect, rather than cut when the grace ends.
        shutdown_grace_s: u64 = 10, within 0..=3_600 "s";
        /// After the grace (and a second for the answers given at its end),
        /// how long the process has to stop its background tasks and flush
        /// its spans before it exits whatever still runs.
        shutdown_cleanup_ms_max: u64 = 2_000, within 100..=60_000 "ms";
        /// How long a readiness verdict answers `/readyz`, so that probes
        /// from anyone cost the stores one round trip each per period at
        /// most; 0 probes on every call.
        readiness_cache_ms: u64 = 1_000, within 0..=60_000 "ms";
        /// How log lines are written.
        log_format: LogFormat = LogFormat::Text;
        /// Names this process in the decision feed and the logs. Empty: the
        /// host name and a random suffix.
        instance_id: String = String::new(), empty "the host name and a random suffix";
        /// Whether the cookies this service sets carry `Secure` (sent over
        /// HTTPS only). Set it where browsers reach the service over HTTPS,
        /// as behind a TLS load balancer. It is a setting and not the
        /// request's scheme, because `X-Forwarded-Proto` is any client's to
        /// send, and a proxy in front may overwrite it with its own `http`.
        cookies_secure: bool = false;
    }

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
        /// Transfers that may run at once on this instance; each holds a
        /// database connection while it runs, so more than
        /// `db_pool_connections_max` would only queue for one.
        transfers_in_flight_max: u32 = 16, within 1..=10_000 "transfers";
        /// Transfers that may wait for one of those places; one that finds
        /// this queue full is refused at once with 503
        /// `/problems/overloaded` and `Retry-After`, having changed nothing.
        /// About `transfers_in_flight_max`: enough that a place freed is
        /// taken at once, while under overload a refusal costs no wait.
        transfers_admission_queue_max: u32 = 16, within 0..=10_000 "transfers";
        /// How long a queued transfer waits for a place before it is
        /// refused the same way. Short, and under `db_acquire_wait_ms_max`:
        /// load past what the database can take is refused at once, instead
        /// of queueing until it times out.
        transfers_admission_wait_ms_max: u64 = 50, within 0..=60_000 "ms";
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
        /// Commands in flight at once on the shared Redis connection; further
        /// ones wait (within `redis_command_timeout_ms`).
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

    section "Layer 1: cooldown lock" {
        /// The cooldown lock on or off; off, keyless double clicks pay twice
        /// (an unsafe demonstration mode).
        cooldown_enabled: bool = true;
        /// The cooldown window: how long a further transfer under the same
        /// lock is refused.
        cooldown_ttl_ms: u64 = 5_000, within 1..=86_400_000 "ms";
        /// What the lock is keyed on besides the user: the action
        /// (`user_action`), or the action and the request body
        /// (`user_action_body`).
        cooldown_scope: CooldownScope = CooldownScope::UserAction;
        /// What the cooldown and the account limits do when Redis cannot be
        /// reached: let the request through (`fail_open`) or answer 503
        /// (`fail_closed`).
        cooldown_on_store_error: StoreErrorPolicy = StoreErrorPolicy::FailOpen;
    }

    section "Layer 2: idempotency key" {
        /// How a key is claimed. `advisory_lock` and `redis_key_lock` are the
        /// common alternatives, kept to compare with; `check_then_insert` is
        /// the naive one and `off` ignores keys. Each is a demonstration
        /// mode.
        idempotency_mode: IdempotencyMode = IdempotencyMode::Atomic;
        /// With `idempotency_mode = advisory_lock`: wait for a key's lock
        /// held by another request (bounded by `wallet_lock_wait_ms_max`)
        /// instead of answering 409 at once.
        idempotency_advisory_lock_waits: bool = false;
        /// With `idempotency_mode = redis_key_lock`: how long a key's Redis
        /// lock lives. A holder paused longer loses it to the next request.
        idempotency_redis_lock_ttl_ms: u64 = 5_000, within 10..=600_000 "ms";
        /// A transfer without an `Idempotency-Key` header gets 400.
        idempotency_key_required: bool = false;
        /// How long a request waits for a concurrent request with the same key
        /// to finish before answering 409.
        idempotency_wait_ms_max: u16 = 2_000, within 1..=60_000 "ms";
        /// How long a key is remembered.
        idempotency_retention_hours: u16 = 24, within 1..=8_760 "hours";
        /// How often expired keys are deleted.
        idempotency_sweep_interval_s: u64 = 900, within 1..=86_400 "s";
        /// Rows one sweep statement deletes at most.
        idempotency_sweep_batch_rows_max: i64 = 10_000, within 1..=100_000 "rows";
    }

    section "Layer 3: row guard" {
        /// How the debit checks the balance. `for_update` and
        /// `optimistic_version` are the common alternatives, kept to compare
        /// with; `read_decide_write` is the naive one. Each is a
        /// demonstration mode.
        row_guard_mode: RowGuardMode = RowGuardMode::Guarded;
    }

    section "Deposits from a payment provider" {
        /// Secrets the provider signs deposit webhooks with, each at least 32
        /// bytes. Several at once let a secret be rotated without refusing a
        /// delivery: add the new one, move the provider over, remove the old.
        provider_webhook_secrets: Vec<SecretString> = Vec::new(),
            empty "no provider can sign, so every deposit is refused (401)";
        /// How far a signature's time may be from this server's clock, either
        /// way; an older signed delivery is refused as a replay.
        provider_signature_tolerance_s: u64 = 300, within 1..=3_600 "s";
        /// The oldest event accepted: one whose `occurred_at` lies further
        /// back is refused, and the refusal stored. An event's
        /// `occurred_at` may lie at most `provider_signature_tolerance_s`
        /// ahead of the database's clock; a later one is refused the same
        /// way.
        deposit_event_age_hours_max: u16 = 720, within 1..=8_760 "hours";
        /// Largest single deposit; a larger one is refused, and the refusal
        /// stored like a credit.
        deposit_amount_minor_max: i64 = 100_000_000, within 1..=1_000_000_000_000_000 "minor units";
        /// How long the inbox keeps an event's claim. It must exceed
        /// `deposit_event_age_hours_max` + `provider_signature_tolerance_s`:
        /// by the time a claim is swept, every event it could stand for is
        /// refused as too old, so none is applied twice; likewise
        /// `commands_age_hours_max` + `commands_future_tolerance_s` for
        /// broker commands. Providers retry for up to a few days.
        inbox_retention_hours: u16 = 744, within 1..=8_760 "hours";
        /// How long a delivery waits in PostgreSQL for a concurrent delivery of
        /// the same event to commit, before answering 409.
        inbox_wait_ms_max: u16 = 2_000, within 1..=60_000 "ms";
        /// `atomic`: the claim is inserted first, in the credit's transaction.
        /// `check_then_insert` is DEMO ONLY (it credits a redelivered event
        /// twice) and needs `allow_unsafe_demo_modes`.
        inbox_mode: InboxMode = InboxMode::Atomic;
        /// The edge lock on each event, in Redis. Off, every duplicate
        /// delivery reaches PostgreSQL, where the inbox still applies the
        /// event once.
        event_lock_enabled: bool = true;
        /// How long one delivery holds an event's edge lock at most; a burst of
        /// the event's deliveries within it reaches PostgreSQL once.
        event_lock_ttl_ms: u64 = 10_000, within 100..=600_000 "ms";
        /// How long a duplicate delivery waits at the edge for the first one's
        /// answer before asking the inbox itself.
        event_duplicate_wait_ms_max: u64 = 3_000, within 0..=60_000 "ms";
        /// How often a waiting duplicate looks for that answer.
        event_answer_poll_ms: u64 = 20, within 1..=1_000 "ms";
        /// How long the first delivery's answer stays at the edge for the
        /// duplicates; later deliveries get it from the inbox.
        event_answer_cache_ms: u64 = 30_000, within 1_000..=3_600_000 "ms";
    }

    section "Transfer commands from a broker" {
        /// Consume transfer commands from the Redis streams on this instance,
        /// as a member of the deployment's one consumer group. Off unless
        /// configured: whoever can write to the streams can move any
        /// wallet's money, so a deployment turns it on only once their Redis
        /// has the ACL of deploy/redis-commands.conf (docs/security.md).
        commands_enabled: bool = false;
        /// The Redis holding the command streams, when not the cooldown's:
        /// until a command is consumed it lives only there, so it should run
        /// with the append-only file on.
        commands_redis_url: SecretString = SecretString::from(""),
            empty "the Redis at `redis_url` (or `redis_cluster_urls`)";
        /// Streams the commands are spread over by source wallet; one
        /// consumer works a partition at a time, in order. Every issuer and
        /// every instance must agree on it.
        commands_partitions: u16 = 4, within 1..=256 "partitions";
        /// The visibility timeout: a consumer that holds an entry (and its
        /// partition) this long without finishing loses both, and another
        /// consumer claims the entry.
        commands_claim_idle_ms: u64 = 30_000, within 100..=3_600_000 "ms";
        /// Deliveries of one entry without an outcome before it is moved to
        /// the dead-letter stream.
        commands_deliveries_max: u32 = 5, within 1..=1_000 "deliveries";
        /// Entries one read takes at most.
        commands_read_batch_entries_max: usize = 16, within 1..=1_000 "entries";
        /// How long an idle consumer's read waits for new entries.
        commands_read_wait_ms: u64 = 1_000, within 10..=60_000 "ms";
        /// The pause after an entry could not be applied (the database is
        /// down), or after Redis failed, before trying again.
        commands_retry_backoff_ms: u64 = 1_000, within 10..=600_000 "ms";
        /// Length cap of the results stream (approximate, `MAXLEN ~`).
        commands_results_entries_max: u64 = 100_000, within 100..=100_000_000 "entries";
        /// Length cap of the dead-letter stream (approximate, `MAXLEN ~`).
        commands_dead_letters_entries_max: u64 = 100_000, within 100..=100_000_000 "entries";
        /// The oldest command applied, by its stream entry id's time; an
        /// older one is refused (`too_old`), and the refusal stored.
        commands_age_hours_max: u16 = 720, within 1..=8_760 "hours";
        /// How far a command's entry id may lie ahead of the database's
        /// clock: the drift allowed between the broker's Redis and it. A
        /// command published further ahead (an explicit id in `XADD`) is
        /// refused (`published_in_future`), and the refusal stored.
        commands_future_tolerance_s: u64 = 300, within 1..=3_600 "s";
    }

    section "Payouts through a bank gateway" {
        /// The bank gateway's base URL (`POST {url}/v1/payouts`,
        /// `GET {url}/v1/payouts/{key}`). Empty: this deployment sends no
        /// payouts, and `POST /api/v1/payouts` says so.
        payout_gateway_url: String = String::new(), empty "no payouts";
        /// Run the payout dispatcher on this instance: it takes due outbox
        /// rows and asks the gateway. Every instance may run one.
        payout_dispatcher_enabled: bool = true;
        /// How a payout reaches the gateway. Anything but `outbox` is a
        /// demonstration of a way to send money twice, or without a debit.
        payout_mode: PayoutMode = PayoutMode::Outbox;
        /// How long a dispatcher holds an outbox row it took: another instance
        /// takes the row over after it, so it must be longer than one
        /// gateway call (`payout_call_timeout_ms`).
        payout_lease_ms: u64 = 30_000, within 1_000..=3_600_000 "ms";
        /// How long one gateway call may take before its outcome counts as
        /// unknown and it is retried with the same key.
        payout_call_timeout_ms: u64 = 5_000, within 50..=600_000 "ms";
        /// The first backoff ceiling after an unknown outcome; each attempt
        /// doubles it, up to `payout_retry_cap_ms`, and waits a random time
        /// below it (full jitter), never less than the gateway's
        /// `Retry-After`.
        payout_retry_base_ms: u64 = 500, within 10..=600_000 "ms";
        /// The largest backoff ceiling.
        payout_retry_cap_ms: u64 = 60_000, within 10..=3_600_000 "ms";
        /// Gateway calls one payout gets, the first included; after the last
        /// without a known outcome it needs a person (`wallet-server
        /// reconcile`).
        payout_attempts_max: u32 = 8, within 1..=1_000 "attempts";
        /// Outbox rows one dispatcher takes, and calls the gateway for, at once.
        payout_dispatch_batch_rows_max: u32 = 16, within 1..=1_000 "rows";
        /// How long a dispatcher that found nothing due waits before looking
        /// again.
        payout_dispatch_idle_ms: u64 = 200, within 10..=60_000 "ms";
        /// How often a dispatcher counts the outbox for the metrics.
        payout_census_interval_ms: u64 = 5_000, within 100..=600_000 "ms";
        /// `wallet-server reconcile` leaves a payout alone until this long
        /// after its last attempt, so that a gateway still working on a call
        /// given up on has finished it before it is asked.
        payout_reconcile_quiet_ms: u64 = 60_000, within 0..=86_400_000 "ms";
        /// How long the bank gateway promises to remember an
        /// `Idempotency-Key` after its first request. Past it, the gateway's
        /// "no such payout" may mean it forgot a sending, so `wallet-server
        /// reconcile` keeps such a payout's hold for a person; and a
        /// payout's attempts must all fall within it.
        payout_gateway_key_retention_hours: u16 = 24, within 1..=8_760 "hours";
        /// Largest single payout.
        payout_amount_minor_max: i64 = 1_000_000, within 1..=1_000_000_000_000_000 "minor units";
    }

    section "Unsafe demonstration modes" {
        /// Must be on for the server to start with any layer disabled or in a
        /// naive mode. Never in production.
        allow_unsafe_demo_modes: bool = false;
        /// A pause inside the naive variants' race windows (between check and
        /// insert, between read and write), so that demonstrations of the races
        /// they allow are reliable rather than lucky.
        naive_window_ms: u64 = 0, within 0..=10_000 "ms";
    }

    section "Race lab" {
        /// Lets a race-lab run switch layers off for its own lab wallets; real
        /// wallets refuse the switches whatever this says. Off: every run goes
        /// through all three layers.
        race_lab_switches_enabled: bool = true;
        /// Requests one race-lab run fires at once.
        race_lab_requests_max: usize = 200, within 2..=1_000 "requests";
        /// Race-lab runs one instance fires at once; a further one is refused.
        race_lab_runs_in_flight_max: usize = 2, within 1..=64 "runs";
        /// What each of a visitor's two lab wallets holds when a run starts.
        race_lab_balance_minor: i64 = 10_000, within 100..=1_000_000_000 "minor units";
        /// A run's requests are given up after this long (the retry preset
        /// waits out the cooldown window inside it).
        race_lab_run_ms_max: u64 = 30_000, within 1_000..=600_000 "ms";
        /// The pause inside a lab run's naive race windows (check-then-insert,
        /// read-decide-write), so that the race a switched-off layer allows
        /// shows on every run rather than by luck.
        race_lab_naive_window_ms: u64 = 50, within 0..=1_000 "ms";
        /// A visitor's runs start at least this far apart, across instances.
        race_lab_run_spacing_ms: u64 = 1_000, within 0..=600_000 "ms";
        /// Runs one visitor may start in any minute, across instances.
        race_lab_runs_per_user_per_minute_max: u32 = 10, within 1..=1_000 "runs";
        /// Lab requests all runs on one instance may have in flight at once: a
        /// run that would pass it is refused, so the lab cannot starve real
        /// transfers of workers and connections.
        race_lab_requests_in_flight_max: usize = 400, within 2..=10_000 "requests";
        /// PostgreSQL connections the lab's transactions hold at once; further
        /// lab requests wait for one, so a burst never takes the pool from real
        /// transfers. At most all but one of `db_pool_connections_max` are used.
        race_lab_db_connections_max: u32 = 4, within 1..=1_000 "connections";
        /// How long a lab request's pass is valid after the burst mints it,
        /// just before sending the request.
        race_lab_pass_lifetime_ms: u64 = 5_000, within 100..=600_000 "ms";
        /// Used passes one instance remembers until they expire, so that none
        /// is accepted twice. Past it, lab requests are answered busy.
        race_lab_passes_held_max: usize = 20_000, within 100..=1_000_000 "passes";
        /// How long a run's results stay at their address
        /// (`/race-lab/runs/{id}`); the sweeper deletes them after it.
        race_lab_result_retention_hours: u64 = 168, within 1..=8_760 "hours";
        /// Results one visitor keeps at once: a newer run's results push out
        /// their oldest. At least four, since a comparison is four runs.
        race_lab_results_per_user_max: i64 = 50, within 4..=10_000 "results";
    }

    section "Browser demo" {
        /// An account made at start-up (after migrations) that anyone can send
        /// to and nobody can sign in as, so that a lone visitor has a
        /// recipient. Empty: none.
        demo_recipient_name: String = "demo".into();
        /// A trace viewer's URL with `{trace_id}` in it, e.g.
        /// `http://127.0.0.1:16686/trace/{trace_id}` for Jaeger; the race lab
        /// links each request to its trace. Empty: no links.
        trace_ui_url: String = String::new(), empty "no links";
        /// How long the page a wallet form leads to (a review, or what
        /// happened after Send) stays at its address, so that reloading it
        /// shows it again. One per person; their next form replaces it.
        wallet_page_retention_s: u64 = 3_600, within 10..=86_400 "s";
    }

    section "Decision feed" {
        /// Write and serve the decision feed.
        decision_feed_enabled: bool = true;
        /// In-process queue between requests and the feed writer; entries
        /// beyond it are dropped (and counted), never waited for.
        decision_feed_queue_entries_max: usize = 10_000, within 1..=1_000_000 "entries";
        /// The feed writer sends what is queued this often, rather than
        /// being woken by every request; an entry reaches readers this much
        /// later at most. The queue must hold what arrives in one interval.
        decision_feed_write_interval_ms: u64 = 10, within 1..=1_000 "ms";
        /// Length cap of each user's feed stream of real transfers in Redis.
        decision_feed_entries_per_user_max: u64 = 500, within 1..=100_000 "entries";
        /// Length cap of each user's feed stream of race-lab requests, kept
        /// apart from their real transfers' so that a lab burst never pushes
        /// a real decision out.
        decision_feed_lab_entries_per_user_max: u64 = 1_000, within 1..=100_000 "entries";
        /// A user's stream expires this long (up to two minutes more) after
        /// its last entry; its expiry is refreshed at most once a minute.
        decision_feed_retention_hours: u64 = 1, within 1..=720 "hours";
        /// The feed's own footprint: entries across every user's streams
        /// under this deployment's key prefix. Past it, the streams written
        /// least recently are removed whole, so new decisions are always
        /// written and the feed can never fill Redis. About 490 bytes each.
        decision_feed_entries_max: u64 = 100_000, within 1_000..=100_000_000 "entries";
        /// The feed page tells a visitor about entries this server dropped
        /// (a full queue, Redis refusing a write) for this long after.
        decision_feed_drop_notice_s: u64 = 600, within 1..=86_400 "s";
        /// Largest `limit` on `GET /api/v1/decisions`.
        decisions_page_entries_max: usize = 200, within 1..=1_000 "entries";
        /// Concurrent live streams (`/api/v1/decisions/stream`) per instance;
        /// each holds one Redis connection.
        decision_streams_max: usize = 64, within 1..=10_000 "streams";
        /// How long one blocking read of a live stream waits before sending a
        /// keep-alive comment.
        decision_stream_keepalive_ms: u64 = 15_000, within 100..=300_000 "ms";
        /// How often a live stream re-checks that its token is still valid; it
        /// ends when the token is revoked or expires.
        decision_stream_token_check_s: u64 = 5, within 1..=300 "s";
        /// A live stream ends after this long; the client reconnects (a
        /// browser does so by itself, from the last entry it saw).
        decision_stream_lifetime_s: u64 = 900, within 1..=86_400 "s";
        /// A live stream that delivered no entry for this long ends; the
        /// client reconnects when it wants more.
        decision_stream_idle_s: u64 = 300, within 1..=86_400 "s";
        /// Live streams one user may hold on one instance at once. The feed
        /// page holds two (real transfers and lab runs).
        decision_streams_per_user_max: usize = 8, within 1..=1_000 "streams";
        /// Live streams one client address may hold on one instance at
        /// once, whoever is signed in: several people behind one address
        /// share it.
        decision_streams_per_address_max: usize = 16, within 1..=10_000 "streams";
    }

    section "Money and accounts" {
        /// The deployment's one currency: three upper-case letters, not `LAB`
        /// (the race lab's sandbox money).
        currency: String = "USD".into();
        /// Opening balance of a new wallet.
        signup_grant_minor: i64 = 100_000, within 0..=1_000_000_000_000_000 "minor units";
        /// Largest single transfer.
        transfer_amount_minor_max: i64 = 10_000_000, within 1..=1_000_000_000_000_000 "minor units";
        /// Largest `limit` on the transfer history.
        transfers_page_rows_max: i64 = 100, within 1..=1_000 "rows";
        /// Longest user name.
        user_name_chars_max: usize = 64, within 1..=64 "chars";
        /// Shortest password; at most `password_chars_max`.
        password_chars_min: usize = 8, within 1..=1_024 "chars";
        /// Longest password.
        password_chars_max: usize = 128, within 1..=1_024 "chars";
    }

    section "Authentication" {
        /// Key for the MAC on bearer tokens; at least 32 bytes. Every instance
        /// of one deployment needs the same key. Left empty, a random key is made
        /// at start-up (tokens then die with the process: fine for a demo only).
        token_signing_key: SecretString = SecretString::from(""),
            empty "a random key per process, for a demo only";
        /// How long a bearer token stays valid.
        api_token_ttl_hours: u64 = 24, within 1..=8_760 "hours";
        /// Threads that hash and verify passwords (argon2id: CPU and 19 MiB
        /// each, by design); they bound what sign-ins can take.
        password_hash_threads: usize = 2, within 1..=64 "threads";
        /// Sign-ins waiting for a password thread before further ones get 503.
        password_hash_queue_max: usize = 64, within 1..=100_000 "sign-ins";
    }

    section "Account rate limits" {
        /// The sign-up and sign-in limits below. Off only for load tests that
        /// sign up thousands of users from one address.
        account_limits_enabled: bool = true;
        /// Sign-ups one client address may make at once, refilled at this many
        /// per hour. Each of these four limits is counted in Redis across every
        /// instance.
        signup_per_address_per_hour_max: u32 = 20, within 1..=1_000_000 "attempts";
        /// Sign-ups under one name at once, refilled at this many per hour.
        signup_per_name_per_hour_max: u32 = 5, within 1..=1_000_000 "attempts";
        /// Failed sign-ins from one client address at once, refilled at this
        /// many per minute. Sign-ins count only when the password is wrong,
        /// and a refusal is 429 with `Retry-After`.
        signin_per_address_per_minute_max: u32 = 30, within 1..=1_000_000 "attempts";
        /// Failed sign-ins to one name from one client address at once,
        /// refilled at this many per minute.
        signin_per_name_and_address_per_minute_max: u32 = 10, within 1..=1_000_000 "attempts";
        /// Failed sign-ins to one name from all addresses at once, refilled at
        /// this many per minute. It does not apply at an address the name
        /// signed in from within `signin_known_address_days`, so guesses from
        /// elsewhere never lock the owner out there.
        signin_per_name_per_minute_max: u32 = 60, within 1..=1_000_000 "attempts";
        /// How long an address a name signed in from stays exempt from the
        /// name's own limit.
        signin_known_address_days: u64 = 30, within 1..=3_650 "days";
        /// Addresses or networks (CIDR) of the load balancers in front of the
        /// instances. Only from these is `X-Forwarded-For` believed.
        trusted_proxies: Vec<String> = Vec::new(),
            empty "no proxy; the client address is always the TCP peer";
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::checks::Checks;
    use crate::settings::declare::{SettingDoc, Shown};

    /// Units that measure (time, size, money), and the word that names
    /// each in a setting's name.
    const MEASURES: &[(&str, &str)] = &[
        ("ms", "ms"),
        ("s", "s"),
        ("hours", "hours"),
        ("bytes", "bytes"),
        ("minor units", "minor"),
    ];

    fn default_number(setting: &SettingDoc) -> i128 {
        match (setting.default)() {
            Shown::Value(text) => text
                .parse()
                .unwrap_or_else(|error| panic!("{}: {text:?}: {error}", setting.name)),
            other => panic!("{}: a number's default shows as {other:?}", setting.name),
        }
    }

    #[test]
    fn every_number_has_bounds_and_nothing_else_does() {
        for setting in SETTINGS_DOC {
            assert_eq!(setting.is_number, setting.bounds.is_some(), "{}", setting.name);
        }
    }

    #[test]
    fn every_default_lies_within_its_bounds() {
        let mut check = Checks::default();
        Settings::default().check_bounds(&mut check);
        assert!(check.problems().is_empty(), "{:?}", check.problems());
        for setting in SETTINGS_DOC {
            if let Some(bounds) = setting.bounds {
                let default = default_number(setting);
                assert!(
                    bounds.min <= default && default <= bounds.max,
                    "{}: {default} outside {bounds:?}",
                    setting.name
                );
            }
        }
    }

    /// A measured limit ends in its unit, or in its unit and then `_max` /
    /// `_min` (`cooldown_ttl_ms`, `request_body_bytes_max`); a count ends
    /// in `_max` / `_min` or in what it counts (`http_workers`).
    #[test]
    fn every_name_ends_in_its_unit() {
        for setting in SETTINGS_DOC {
            let Some(bounds) = setting.bounds else { continue };
            let name = setting.name;
            let stem = name
                .strip_suffix("_max")
                .or_else(|| name.strip_suffix("_min"))
                .unwrap_or(name);
            let measure = MEASURES.iter().find(|(unit, _)| *unit == bounds.unit);
            match measure {
                Some((_, word)) => assert!(stem.ends_with(&format!("_{word}")), "{name}: unit {word}"),
                None => assert!(
                    stem != name || name.ends_with(&format!("_{}", bounds.unit)),
                    "{name}: a count ends in _max, _min or _{}",
                    bounds.unit
                ),
            }
            for (unit, word) in MEASURES {
                if stem.ends_with(&format!("_{word}")) {
                    assert_eq!(bounds.unit, *unit, "{name} is named in {word}");
                }
            }
        }
    }

    #[test]
    fn a_setting_says_what_empty_means_exactly_when_its_default_is_empty() {
        for setting in SETTINGS_DOC {
            let empty = (setting.default)() == Shown::Empty;
            assert_eq!(empty, setting.empty_means.is_some(), "{}", setting.name);
        }
    }

    #[test]
    fn every_choice_defaults_to_one_of_its_values() {
        for setting in SETTINGS_DOC.iter().filter(|setting| !setting.values.is_empty()) {
            let Shown::Value(default) = (setting.default)() else {
                panic!("{}: a choice's default must show", setting.name);
            };
            assert!(
                setting.values.contains(&default.as_str()),
                "{}: {default}",
                setting.name
            );
        }
    }

    #[test]
    fn every_setting_has_a_doc_and_one_section() {
        let mut sections_seen: Vec<&str> = Vec::new();
        for setting in SETTINGS_DOC {
            assert!(!setting.doc.is_empty(), "{} has no doc", setting.name);
            if sections_seen.last() != Some(&setting.section) {
                assert!(
                    !sections_seen.contains(&setting.section),
                    "section {:?} is declared twice",
                    setting.section
                );
                sections_seen.push(setting.section);
            }
        }
    }
}
