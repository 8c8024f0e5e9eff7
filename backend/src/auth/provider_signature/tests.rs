//! The signature schemes' checks: every way a signature is refused, and
//! rotation through several secrets, in both schemes.

use super::*;

fn secret(text: &str) -> SecretString {
    SecretString::from(text.to_owned())
}

fn ours(header: Option<&[u8]>) -> SignatureHeaders<'_> {
    SignatureHeaders {
        provider_signature: header,
        ..SignatureHeaders::default()
    }
}

fn signatures() -> ProviderSignatures {
    ProviderSignatures::new(
        vec![
            secret("old-secret-old-secret-old-secret-0"),
            secret("new-secret-new-secret-new-secret-1"),
        ],
        std::time::Duration::from_secs(300),
    )
}

#[test]
fn a_signature_under_any_configured_secret_is_accepted() {
    let now = Utc::now();
    let body = br#"{"event_id":"evt_1"}"#;
    for key in [
        "old-secret-old-secret-old-secret-0",
        "new-secret-new-secret-new-secret-1",
    ] {
        let header = header_for(&secret(key), now, body);
        assert_eq!(
            signatures().verify(&ours(Some(header.as_bytes())), body, now),
            Ok(())
        );
    }
}

#[test]
fn every_broken_signature_is_refused_with_its_reason() {
    let now = Utc::now();
    let body = br#"{"event_id":"evt_1"}"#;
    let good = header_for(&secret("new-secret-new-secret-new-secret-1"), now, body);
    let other_key = header_for(&secret("another-secret-another-secret-xx"), now, body);
    let old = header_for(
        &secret("new-secret-new-secret-new-secret-1"),
        now - chrono::TimeDelta::seconds(301),
        body,
    );
    let cases: [(Option<&str>, &[u8], SignatureRefused); 8] = [
        (None, body, SignatureRefused::Missing),
        (Some(""), body, SignatureRefused::Malformed),
        (Some("t=abc,v1=00"), body, SignatureRefused::Malformed),
        (Some(&good[..good.len() - 1]), body, SignatureRefused::Malformed),
        (Some("t=1,v1="), body, SignatureRefused::Malformed),
        (Some(&other_key), body, SignatureRefused::Mismatch),
        (
            Some(&good),
            br#"{"event_id":"evt_2"}"#,
            SignatureRefused::Mismatch,
        ),
        (Some(&old), body, SignatureRefused::Stale),
    ];
    for (header, body, refused) in cases {
        assert_eq!(
            signatures().verify(&ours(header.map(str::as_bytes)), body, now),
            Err(refused),
            "{header:?}"
        );
    }
    let none = ProviderSignatures::new(Vec::new(), std::time::Duration::from_secs(300));
    assert_eq!(
        none.verify(&ours(Some(good.as_bytes())), body, now),
        Err(SignatureRefused::NoSecret)
    );
}

const STANDARD_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn standard_headers<'a>(id: &'a str, at: &'a str, signature: &'a str) -> SignatureHeaders<'a> {
    SignatureHeaders {
        webhook_id: Some(id.as_bytes()),
        webhook_timestamp: Some(at.as_bytes()),
        webhook_signature: Some(signature.as_bytes()),
        ..SignatureHeaders::default()
    }
}

/// The signature `headers_for` makes under a `whsec_` secret: the value of
/// `webhook-signature`.
fn standard_signature(key: &str, id: &str, at: DateTime<Utc>, body: &[u8]) -> String {
    headers_for(&secret(key), id, at, body)
        .into_iter()
        .find(|(name, _)| *name == WEBHOOK_SIGNATURE)
        .map(|(_, value)| value)
        .expect("a whsec_ secret signs Standard Webhooks")
}

#[test]
fn the_specifications_example_verifies() {
    // The example of the Standard Webhooks specification's reference
    // libraries, signed at 1614265330.
    let body = br#"{"test": 2432232314}"#;
    let expected = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
    let at = DateTime::from_timestamp(1_614_265_330, 0).expect("a time");
    assert_eq!(
        standard_signature(STANDARD_SECRET, "msg_p5jXN8AQM9LWM0D4loKWxJek", at, body),
        expected
    );
}

#[test]
fn a_standard_webhook_is_accepted_under_any_whsec_secret_and_among_several_signatures() {
    let now = Utc::now();
    let body = br#"{"event_id":"evt_1"}"#;
    let other = "whsec_dGhlLW90aGVyLWtleS10aGUtb3RoZXIta2V5LTEyMzQ=";
    let both = ProviderSignatures::new(
        vec![secret(STANDARD_SECRET), secret(other)],
        std::time::Duration::from_secs(300),
    );
    let at = now.timestamp().to_string();
    for key in [STANDARD_SECRET, other] {
        let signature = standard_signature(key, "evt_1", now, body);
        assert_eq!(
            both.verify(&standard_headers("evt_1", &at, &signature), body, now),
            Ok(())
        );
    }
    // During a rotation the sender signs with both: an unknown version and
    // a stale key are passed over.
    let rotated = format!(
        "v1a,AAAA {} {}",
        standard_signature(
            "whsec_b2xkLW9sZC1vbGQtb2xkLW9sZC1vbGQtb2xkLW9sZA==",
            "evt_1",
            now,
            body
        ),
        standard_signature(STANDARD_SECRET, "evt_1", now, body)
    );
    assert_eq!(
        both.verify(&standard_headers("evt_1", &at, &rotated), body, now),
        Ok(())
    );
}

const BODY: &[u8] = br#"{"event_id":"evt_1"}"#;

/// Signatures under the Standard Webhooks secret and one of ours.
fn mixed() -> ProviderSignatures {
    ProviderSignatures::new(
        vec![
            secret(STANDARD_SECRET),
            secret("old-secret-old-secret-old-secret-0"),
        ],
        std::time::Duration::from_secs(300),
    )
}

fn assert_refused(cases: Vec<(SignatureHeaders<'_>, SignatureRefused)>, now: DateTime<Utc>) {
    for (headers, refused) in cases {
        assert_eq!(mixed().verify(&headers, BODY, now), Err(refused), "{headers:?}");
    }
}

#[test]
fn every_malformed_standard_webhook_is_refused_as_such() {
    let now = Utc::now();
    let at = now.timestamp().to_string();
    let good = standard_signature(STANDARD_SECRET, "evt_1", now, BODY);
    let five = format!("{good} {good} {good} {good} {good}");
    let malformed = |headers| (headers, SignatureRefused::StandardMalformed);
    assert_refused(
        vec![
            malformed(standard_headers("evt_1", &at, "v1,not base64!")),
            malformed(standard_headers("evt_1", &at, "v1")),
            malformed(standard_headers("evt_1", &at, "v2,AAAA")),
            malformed(standard_headers("evt_1", &at, "v1,AAAA")),
            malformed(standard_headers("evt_1", &at, &five)),
            malformed(standard_headers("evt_1", "soon", &good)),
            malformed(standard_headers("evt 1", &at, &good)),
            malformed(SignatureHeaders {
                webhook_id: Some(b"evt_1"),
                ..SignatureHeaders::default()
            }),
            (
                SignatureHeaders {
                    provider_signature: Some(b"t=1,v1=00"),
                    ..standard_headers("evt_1", &at, &good)
                },
                SignatureRefused::BothSchemes,
            ),
        ],
        now,
    );
}

#[test]
fn every_wrong_or_stale_standard_webhook_is_refused_with_its_reason() {
    let now = Utc::now();
    let at = now.timestamp().to_string();
    let shifted = |seconds| now + chrono::TimeDelta::seconds(seconds);
    let (ahead, behind) = (
        shifted(301).timestamp().to_string(),
        shifted(-301).timestamp().to_string(),
    );
    let signed_ahead = standard_signature(STANDARD_SECRET, "evt_1", shifted(301), BODY);
    let signed_behind = standard_signature(STANDARD_SECRET, "evt_1", shifted(-301), BODY);
    let other_id = standard_signature(STANDARD_SECRET, "evt_2", now, BODY);
    let unknown_key = standard_signature(
        "whsec_b2xkLW9sZC1vbGQtb2xkLW9sZC1vbGQtb2xkLW9sZA==",
        "evt_1",
        now,
        BODY,
    );
    assert_refused(
        vec![
            (
                standard_headers("evt_1", &ahead, &signed_ahead),
                SignatureRefused::Stale,
            ),
            (
                standard_headers("evt_1", &behind, &signed_behind),
                SignatureRefused::Stale,
            ),
            (
                standard_headers("evt_1", &at, &unknown_key),
                SignatureRefused::Mismatch,
            ),
            (
                standard_headers("evt_2", &at, &other_id),
                SignatureRefused::IdNotEventId,
            ),
            (
                standard_headers("evt_1", &at, &other_id),
                SignatureRefused::Mismatch,
            ),
        ],
        now,
    );
    // Our scheme's secrets sign nothing in Standard Webhooks.
    let good = standard_signature(STANDARD_SECRET, "evt_1", now, BODY);
    assert_eq!(
        signatures().verify(&standard_headers("evt_1", &at, &good), BODY, now),
        Err(SignatureRefused::Mismatch)
    );
}
