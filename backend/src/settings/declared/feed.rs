//! The settings of the live decision feed.
//!
//! Declared as `declared.rs` says: this file's macro adds its sections to
//! those gathered before it. The types it names are in scope where the
//! declaration expands, in `declared.rs`.

/// Adds this file's sections to the declaration (`declare_settings!`'s
/// `@gather`).
macro_rules! feed_settings {
    ([$($files:ident)*] $($sections:tt)*) => {
        $crate::settings::declare::declare_settings! { @gather [$($files)*] $($sections)*
            section "Decision feed" {
                /// Write and serve the decision feed.
                decision_feed_enabled: bool = true;
                /// In-process queue between requests and the feed writer; entries
                /// beyond it are dropped (and counted), never waited for.
                decision_feed_queue_entries_max: usize = 10_000, within 1..=1_000_000 "entries";
                /// The feed writer sends what is queued this often, rather than
                /// being woken by every request; an entry reaches readers this much
                /// later at most. The queue must hold what arrives in one interval.
                /// Each write is two Redis round trips (the entries, then the
                /// footprint's count) and wakes the writer three times whatever
                /// it carries: at 10 ms the feed took about a tenth of the server's
                /// CPU under load, mostly in those wake-ups, while a person reading
                /// the feed cannot tell 100 ms from 10.
                decision_feed_write_interval_ms: u64 = 100, within 1..=1_000 "ms";
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

        }
    };
}

pub(super) use feed_settings;
