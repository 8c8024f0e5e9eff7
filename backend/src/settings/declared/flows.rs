//! The settings of the ways money comes in and goes out besides a
//! client's transfer: deposits from a payment provider, transfer commands
//! from a broker, payouts through a bank gateway.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! flows_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "Deposits from a payment provider" {
                /// Secrets the provider signs deposit webhooks with. One of at least 32
                /// bytes signs `Provider-Signature`; one written `whsec_` and the base64
                /// of 24 to 64 bytes signs Standard Webhooks (`webhook-signature`).
                /// Several at once let a secret be rotated without refusing a
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
                /// Most commands one PostgreSQL call applies together
                /// (`broker_command_batch()`): a read batch goes in calls of at most
                /// this many. Each command opens up to two subtransactions that write
                /// (its inbox claim's and its decision's), and PostgreSQL keeps 64 per
                /// transaction in its cache; past them every snapshot taken anywhere in
                /// the database must look subtransactions up in `pg_subtrans`. So at
                /// most 32. 1: each command in a call of its own (`broker_command()`).
                commands_apply_batch_max: usize = 16, within 1..=32 "commands";
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
                /// Gateway calls one dispatcher keeps in flight at once. As calls come
                /// back, their answers are recorded and their slots filled with more
                /// due rows; the rows a dispatcher holds never number more.
                payout_gateway_calls_in_flight_max: u32 = 64, within 1..=1_000 "calls";
                /// Gateway answers one dispatcher records together at most: the sent
                /// payouts among them settle in one transaction.
                payout_dispatch_batch_rows_max: u32 = 32, within 1..=1_000 "rows";
                /// The fewest free call slots a dispatcher fills at once while calls
                /// are in flight: each take is a transaction, and one per answer
                /// that came back would cost the busy outbox a commit per payout.
                /// With nothing in flight, or this many slots free, it takes what
                /// is due; at most `payout_gateway_calls_in_flight_max`.
                payout_take_rows_min: u32 = 16, within 1..=1_000 "rows";
                /// How long a dispatcher with nothing due and no call in flight waits
                /// before looking again.
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

        }
    };
}

pub(super) use flows_settings;
