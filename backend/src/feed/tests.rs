//! Stream names, cursors and expiry refreshes.

use super::expiry::{EXPIRY_REFRESH_INTERVAL, ExpiryMemo};
use super::{Source, is_stream_id, parse_stream_name, stream_name};
use crate::domain::UserId;

#[test]
fn a_streams_expiry_is_refreshed_at_most_once_per_interval_and_at_least_once_per_two() {
    let mut memo = ExpiryMemo::new();
    let alice = (UserId(uuid::Uuid::new_v4()), Source::Real);
    let bob = (UserId(uuid::Uuid::new_v4()), Source::Real);
    let start = memo.generation_started;
    assert!(memo.needs_refresh(alice, start));
    assert!(!memo.needs_refresh(alice, start));
    assert!(memo.needs_refresh(bob, start));
    // Alice's lab stream is a stream of its own.
    assert!(memo.needs_refresh((alice.0, Source::Lab), start));
    // Within the next interval, still remembered (the previous generation).
    let next = start + EXPIRY_REFRESH_INTERVAL;
    assert!(!memo.needs_refresh(alice, next));
    // Two intervals on, refreshed again.
    let after_two = next + EXPIRY_REFRESH_INTERVAL;
    assert!(memo.needs_refresh(alice, after_two));
    assert!(!memo.needs_refresh(alice, after_two));
}

#[test]
fn a_stream_name_is_read_back_as_its_stream() {
    let user = UserId(uuid::Uuid::new_v4());
    for source in [Source::Real, Source::Lab] {
        assert_eq!(
            parse_stream_name(&stream_name(user, source)),
            Some((user, source))
        );
    }
    assert_eq!(parse_stream_name("total"), None);
}

#[test]
fn only_stream_ids_are_cursors() {
    assert!(is_stream_id("1700000000000-0"));
    assert!(!is_stream_id("1700000000000"));
    assert!(!is_stream_id("+"));
    assert!(!is_stream_id("1-2-3"));
    assert!(!is_stream_id("1-x"));
    assert!(!is_stream_id("+1-0"), "u64 parsing alone would take a sign");
    assert!(is_stream_id("9999999999999999999-9999999999999999999"));
    assert!(
        !is_stream_id("99999999999999999999-0"),
        "past u64: Redis rejects it"
    );
}
