//! The edges of money that leaves: what `reconcile` does when the answer
//! it gets is not the gateway's own word on the key (a wrong path, a
//! proxy's 404, a redirect, a gateway past its key retention), what the
//! dispatcher does with a retry that comes after that retention, how long
//! a gateway's `Retry-After` may hold a payout, and whose payouts a list's
//! cursor may name. Each payout here was really sent by the gateway
//! simulator, so a released hold would be money paid twice.

use std::time::{Duration, Instant};

use layered_wallet::payout::reconcile::{self, Reconciled};
use serde_json::Value;
use uuid::Uuid;
use wallet_testkit::gateway::{Gateway, StandIn, wallet_sim_binary};
use wallet_testkit::*;

/// What each payout here pays out.
const AMOUNT_MINOR: i64 = 5_000;
/// What every new user starts with.
const STARTING_MINOR: i64 = 100_000;

/// A payout the gateway sent whose answer was lost, with one attempt
/// allowed: it needs a person, and the gateway's ledger shows it sent.
async fn sent_and_needing_attention(gateway_knobs: &[&str]) -> (Gateway, TestApp, TestUser, Uuid) {
    let mut knobs = vec!["--lose-answer-rate", "1", "--lose-answer-ms", "3000"];
    knobs.extend_from_slice(gateway_knobs);
    let gateway = Gateway::start(&wallet_sim_binary(), &knobs).await;
    let app = spawn_app(|settings| {
        with_payouts(&gateway.url)(settings);
        settings.payout_attempts_max = 1;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let payout = app.pay_out(&alice, AMOUNT_MINOR, "acct-1").await;
    assert_eq!(
        app.wait_for_payout(payout, &["needs_attention"]).await,
        "needs_attention"
    );
    assert_eq!(gateway.sent(&payout.to_string()).await, 1, "the gateway sent it");
    (gateway, app, alice, payout)
}

/// `wallet-server reconcile` as the app is configured, asking `gateway_url`.
async fn reconcile_asking(app: &TestApp, gateway_url: &str) -> Reconciled {
    let mut settings = app.settings.clone();
    settings.payout_gateway_url = gateway_url.to_owned();
    let config = settings.validate().expect("valid settings");
    reconcile::run(&app.db, &config).await.expect("reconcile")
}

/// The hold is where it was, and the payout says why it still needs a
/// person.
async fn assert_the_hold_stays(
    app: &TestApp,
    owner: &TestUser,
    payout: Uuid,
    reconciled: &Reconciled,
    why: &str,
) {
    assert!(
        reconciled.released.is_empty() && reconciled.settled.is_empty(),
        "{reconciled:?}"
    );
    assert_eq!(reconciled.left.len(), 1, "{reconciled:?}");
    assert_eq!(reconciled.left[0].0, payout);
    assert!(reconciled.left[0].1.contains(why), "{reconciled:?}");
    assert_eq!(app.payout_state(payout).await, "needs_attention");
    assert_eq!(app.held_minor().await, AMOUNT_MINOR, "the hold stays");
    assert_eq!(app.balance(owner.wallet_id).await, STARTING_MINOR - AMOUNT_MINOR);
    let reason: Option<String> = sqlx::query_scalar("SELECT reason FROM payouts WHERE id = $1")
        .bind(payout)
        .fetch_one(&app.db)
        .await
        .expect("the payout's reason");
    assert!(
        reason.as_deref().is_some_and(|reason| reason.contains(why)),
        "{reason:?}"
    );
    assert_eq!(money_invariant_violations(&app.db).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_wrong_gateway_path_answering_404_keeps_the_hold_and_the_right_one_settles_it() {
    let (gateway, app, alice, payout) = sent_and_needing_attention(&[]).await;
    let wrong_path = format!("{}/api", gateway.url);
    let reconciled = reconcile_asking(&app, &wrong_path).await;
    assert_the_hold_stays(
        &app,
        &alice,
        payout,
        &reconciled,
        "404 without the gateway's unknown-key",
    )
    .await;

    // Asked at the right URL, the gateway says it sent it.
    let reconciled = reconcile_asking(&app, &gateway.url).await;
    assert_eq!(reconciled.settled, vec![payout]);
    assert_eq!(app.held_minor().await, 0);
    assert_eq!(app.balance(alice.wallet_id).await, STARTING_MINOR - AMOUNT_MINOR);
    assert_eq!(gateway.sent(&payout.to_string()).await, 1);
}

#[tokio::test]
async fn a_proxy_answering_404_on_every_path_keeps_the_hold() {
    let (_gateway, app, alice, payout) = sent_and_needing_attention(&[]).await;
    let proxy = StandIn::proxy_404().await;
    let reconciled = reconcile_asking(&app, &proxy.url).await;
    assert_the_hold_stays(
        &app,
        &alice,
        payout,
        &reconciled,
        "404 without the gateway's unknown-key",
    )
    .await;
}

#[tokio::test]
async fn a_redirect_to_a_404_is_not_followed_and_keeps_the_hold() {
    let (_gateway, app, alice, payout) = sent_and_needing_attention(&[]).await;
    let proxy = StandIn::proxy_404().await;
    let redirect = StandIn::redirect_to(&format!("{}/v1/payouts/{payout}", proxy.url)).await;
    let reconciled = reconcile_asking(&app, &redirect.url).await;
    assert_the_hold_stays(&app, &alice, payout, &reconciled, "302 redirect").await;
}

/// The gateway sent it, then forgot the key after its retention period:
/// its unknown-key answer is now its own and well-formed, yet says nothing
/// about a payout older than what it promised to remember.
#[tokio::test]
async fn a_gateway_that_forgot_the_key_after_its_retention_keeps_the_hold_of_an_older_payout() {
    let (gateway, app, alice, payout) = sent_and_needing_attention(&["--key-retention-ms", "1"]).await;
    let (status, _) = gateway.look_up(&payout.to_string()).await;
    assert_eq!(status, 404, "the gateway forgot the key");
    // A day and an hour later, past payout_gateway_key_retention_hours.
    sqlx::query("UPDATE payouts SET created_at = created_at - interval '25 hours' WHERE id = $1")
        .bind(payout)
        .execute(&app.db)
        .await
        .expect("the payout made a day ago");
    let reconciled = reconcile_asking(&app, &gateway.url).await;
    assert_the_hold_stays(
        &app,
        &alice,
        payout,
        &reconciled,
        "payout_gateway_key_retention_hours",
    )
    .await;
    assert_eq!(gateway.sent(&payout.to_string()).await, 1);
}

/// The instance dies while the gateway holds back its answer to a sending,
/// and no dispatcher runs again for longer than the gateway's key
/// retention, which forgets the key meanwhile. The retry with the same key
/// would be a new sending: it is not made, and the payout needs a person.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_retry_after_the_gateways_key_retention_is_not_sent_and_the_payout_needs_attention() {
    let gateway = Gateway::start(
        &wallet_sim_binary(),
        &[
            "--lose-answer-rate",
            "1",
            "--lose-answer-ms",
            "2000",
            "--key-retention-ms",
            "1",
        ],
    )
    .await;
    let mut first = spawn_app(|settings| {
        with_payouts(&gateway.url)(settings);
        settings.payout_call_timeout_ms = 2_500;
    })
    .await;
    let alice = first.sign_up("alice").await;
    let payout = first.pay_out(&alice, AMOUNT_MINOR, "acct-1").await;
    let deadline = Instant::now() + Duration::from_secs(PAYOUT_WAIT_SECONDS_MAX);
    while gateway.sent(&payout.to_string()).await == 0 {
        assert!(Instant::now() < deadline, "the gateway never sent");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.kill().await;
    assert_eq!(
        first.payout_state(payout).await,
        "sent",
        "killed before the settlement"
    );

    // A day and an hour later, past payout_gateway_key_retention_hours; the
    // dead instance's lease has long run out.
    sqlx::query("UPDATE payouts SET created_at = created_at - interval '25 hours' WHERE id = $1")
        .bind(payout)
        .execute(&first.db)
        .await
        .expect("the payout made a day ago");
    sqlx::query("UPDATE payout_outbox SET due_at = now() WHERE payout_id = $1")
        .bind(payout)
        .execute(&first.db)
        .await
        .expect("the lease ran out");
    let (status, _) = gateway.look_up(&payout.to_string()).await;
    assert_eq!(status, 404, "the gateway forgot the key");

    let second = spawn_second_instance(&first).await;
    assert_eq!(
        second
            .wait_for_payout(payout, &["needs_attention", "settled", "failed"])
            .await,
        "needs_attention"
    );
    let (reason, attempts): (Option<String>, i32) =
        sqlx::query_as("SELECT reason, attempts FROM payouts WHERE id = $1")
            .bind(payout)
            .fetch_one(&second.db)
            .await
            .expect("the payout");
    assert!(
        reason
            .as_deref()
            .is_some_and(|reason| reason.starts_with("not retried")
                && reason.contains("payout_gateway_key_retention_hours")),
        "{reason:?}"
    );
    assert_eq!(attempts, 2, "taken once more, and set aside");
    assert_eq!(gateway.sent(&payout.to_string()).await, 1, "sent once, not again");
    assert_eq!(second.held_minor().await, AMOUNT_MINOR, "the hold stays");
    assert_eq!(
        second.balance(alice.wallet_id).await,
        STARTING_MINOR - AMOUNT_MINOR
    );
    let outbox_rows: i64 = sqlx::query_scalar("SELECT count(*) FROM payout_outbox WHERE payout_id = $1")
        .bind(payout)
        .fetch_one(&second.db)
        .await
        .expect("the outbox");
    assert_eq!(outbox_rows, 0, "no further attempt is due");
    assert_eq!(money_invariant_violations(&second.db).await, Vec::<String>::new());
}

/// A gateway asking for a day's wait gets at most `payout_retry_cap_ms`.
#[tokio::test]
async fn a_gateways_retry_after_of_a_day_is_capped_by_payout_retry_cap_ms() {
    let busy = StandIn::start(
        "503 Service Unavailable",
        &[("Retry-After", "86400"), ("Content-Type", "application/json")],
        r#"{"error":"unavailable","message":"come back tomorrow"}"#,
    )
    .await;
    let cap_ms: u64 = 60_000;
    let app = spawn_app(|settings| {
        with_payouts(&busy.url)(settings);
        settings.payout_retry_cap_ms = cap_ms;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let payout = app.pay_out(&alice, AMOUNT_MINOR, "acct-1").await;

    let deadline = Instant::now() + Duration::from_secs(PAYOUT_WAIT_SECONDS_MAX);
    let (next_attempt_in_s, attempts, state) = loop {
        let postponed: Option<(f64, i32, String)> = sqlx::query_as(
            "SELECT extract(epoch FROM o.due_at - now())::float8, p.attempts, p.state::text
               FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id
              WHERE o.payout_id = $1 AND o.last_error IS NOT NULL",
        )
        .bind(payout)
        .fetch_optional(&app.db)
        .await
        .expect("the outbox row");
        if let Some(postponed) = postponed {
            break postponed;
        }
        assert!(Instant::now() < deadline, "the first attempt was never postponed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!((attempts, state.as_str()), (1, "sent"));
    assert!(
        next_attempt_in_s > 0.0 && next_attempt_in_s <= cap_ms as f64 / 1000.0,
        "the next attempt is due in {next_attempt_in_s} s"
    );
    assert_eq!(
        app.held_minor().await,
        AMOUNT_MINOR,
        "an unknown outcome keeps its hold"
    );
}

/// Another person's payout id as `before=` answers exactly as an id that
/// does not exist: it reveals neither the payout nor when it was made.
#[tokio::test]
async fn another_persons_payout_as_the_list_cursor_answers_as_an_unknown_id() {
    let app = spawn_app(|settings| {
        with_payouts(&format!("http://127.0.0.1:{}", closed_port()))(settings);
        // The payouts stay pending: only the list is under test.
        settings.payout_dispatcher_enabled = false;
        settings.cooldown_ttl_ms = 100;
    })
    .await;
    let alice = app.sign_up("alice").await;
    let bob = app.sign_up("bob").await;
    let bobs_older = app.pay_out(&bob, 100, "acct-1").await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let bobs_newer = app.pay_out(&bob, 200, "acct-1").await;
    let alices = app.pay_out(&alice, 300, "acct-1").await;

    let page = |before: Uuid| {
        let app = &app;
        let bob = &bob;
        async move {
            let response = app
                .client
                .get(app.url(&format!("/api/v1/payouts?before={before}")))
                .bearer_auth(&bob.token)
                .send()
                .await
                .expect("sent");
            (response.status().as_u16(), response.text().await.expect("body"))
        }
    };
    let unknown = page(Uuid::now_v7()).await;
    assert_eq!(unknown, (200, r#"{"items":[]}"#.to_owned()));
    assert_eq!(page(alices).await, unknown, "alice's payout as bob's cursor");

    // Bob's own cursor pages through his own payouts.
    let (status, own) = page(bobs_newer).await;
    let own: Value = serde_json::from_str(&own).expect("json");
    assert_eq!(status, 200);
    assert_eq!(own["items"][0]["id"], bobs_older.to_string(), "{own}");
}

/// A payout's attempts must all reach the gateway while it still
/// remembers the key: settings that spread them wider do not start.
#[test]
fn attempts_spread_past_the_gateways_key_retention_do_not_start() {
    let settings = |attempts_max: u32| layered_wallet::settings::Settings {
        payout_gateway_url: "http://bank".into(),
        payout_lease_ms: 3_600_000,
        payout_retry_cap_ms: 3_600_000,
        payout_gateway_key_retention_hours: 24,
        payout_attempts_max: attempts_max,
        ..layered_wallet::settings::Settings::default()
    };
    // 11 waits of at most 2 hours each fit in a day; 12 do not.
    assert!(settings(12).validate().is_ok());
    let error = settings(13).validate().expect_err("attempts past a day");
    assert!(
        error.to_string().contains("payout_gateway_key_retention_hours"),
        "{error}"
    );
}
