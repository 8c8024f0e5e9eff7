//! Each defense switched off or made naive, to show the double charge it
//! prevents: for every unsafe configuration, real concurrent requests make
//! the violation happen, and the safe configuration shows none. Races are
//! probabilistic, so each demonstration gets a few attempts and a pause
//! inside the naive window (`naive_window_ms`).

use layered_wallet::settings::{IdempotencyMode, InboxMode, RowGuardMode, Settings};
use layered_wallet::startup::Application;
use wallet_testkit::*;

const ATTEMPTS: usize = 3;

/// Transfers recorded under `key` for `user`.
async fn transfers_with_key(app: &TestApp, key: &str) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM transfers WHERE idempotency_key = $1::uuid")
        .bind(key)
        .fetch_one(&app.db)
        .await
        .expect("count")
}

/// Money in all wallets minus the money they were opened with: zero when
/// nothing was created or destroyed (the invariants' one definition).
async fn money_created(app: &TestApp) -> i64 {
    sqlx::query_scalar("SELECT money_created_minor FROM money_invariants()")
        .fetch_one(&app.db)
        .await
        .expect("sum")
}

/// A storm of `copies` identical requests with one key; returns how many
/// transfers that key produced.
async fn storm_with_one_key(app: &TestApp, copies: usize) -> i64 {
    let alice = app.sign_up(&format!("a{}", new_key())).await;
    let bob = app.sign_up(&format!("b{}", new_key())).await;
    let key = new_key();
    let requests = (0..copies)
        .map(|_| app.transfer_request(&alice, bob.wallet_id, 100, Some(&key)))
        .collect();
    fire_together(requests).await;
    transfers_with_key(app, &key).await
}

#[tokio::test]
async fn without_the_cooldown_a_keyless_double_click_pays_twice() {
    let unsafe_app = spawn_app(without_cooldown).await;
    let mut doubled = false;
    for _ in 0..ATTEMPTS {
        let alice = unsafe_app.sign_up(&format!("a{}", new_key())).await;
        let bob = unsafe_app.sign_up(&format!("b{}", new_key())).await;
        let clicks = (0..2)
            .map(|_| unsafe_app.transfer_request(&alice, bob.wallet_id, 100, None))
            .collect();
        fire_together(clicks).await;
        if unsafe_app.balance(alice.wallet_id).await == 100_000 - 200 {
            doubled = true;
            break;
        }
    }
    assert!(doubled, "two keyless clicks never both paid without the cooldown");

    let safe_app = spawn_app(|_| {}).await;
    let (alice, bob) = safe_app.alice_and_bob().await;
    let clicks = (0..2)
        .map(|_| safe_app.transfer_request(&alice, bob.wallet_id, 100, None))
        .collect();
    fire_together(clicks).await;
    assert_eq!(safe_app.balance(alice.wallet_id).await, 100_000 - 100);
}

#[tokio::test]
async fn check_then_insert_lets_one_key_pay_more_than_once() {
    let naive = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_mode = IdempotencyMode::CheckThenInsert;
        settings.naive_window_ms = 100;
    })
    .await;
    let mut worst = 0;
    for _ in 0..ATTEMPTS {
        worst = worst.max(storm_with_one_key(&naive, 10).await);
        if worst > 1 {
            break;
        }
    }
    assert!(worst > 1, "check-then-insert never let a key through twice");
    naive.assert_invariants().await;

    let atomic = spawn_app(|settings| {
        without_cooldown(settings);
        settings.naive_window_ms = 100;
    })
    .await;
    assert_eq!(storm_with_one_key(&atomic, 10).await, 1);
}

/// A storm of `copies` deliveries of one deposit event; returns how many
/// times it was credited.
async fn deposit_storm(app: &TestApp, copies: usize) -> i64 {
    let alice = app.sign_up(&format!("a{}", new_key())).await;
    let event = deposit_event(&new_event_id(), alice.wallet_id, 700);
    let deliveries = (0..copies).map(|_| app.deposit_request(&event)).collect();
    fire_together(deliveries).await;
    let credited = app.balance(alice.wallet_id).await - 100_000;
    assert_eq!(credited % 700, 0, "only whole credits of the event");
    credited / 700
}

#[tokio::test]
async fn a_check_then_insert_inbox_credits_one_event_more_than_once() {
    let naive = spawn_app(|settings| {
        with_deposits(settings);
        settings.event_lock_enabled = false;
        settings.inbox_mode = InboxMode::CheckThenInsert;
        settings.allow_unsafe_demo_modes = true;
        settings.naive_window_ms = 100;
    })
    .await;
    let mut worst = 0;
    for _ in 0..ATTEMPTS {
        worst = worst.max(deposit_storm(&naive, 10).await);
        if worst > 1 {
            break;
        }
    }
    assert!(
        worst > 1,
        "a check-then-insert inbox never credited an event twice"
    );
    naive.assert_invariants().await;

    // The atomic inbox alone, without the edge lock, credits it once.
    let atomic = spawn_app(|settings| {
        with_deposits(settings);
        settings.event_lock_enabled = false;
    })
    .await;
    assert_eq!(deposit_storm(&atomic, 10).await, 1);
}

#[tokio::test]
async fn with_idempotency_off_every_retry_pays() {
    let off = spawn_app(|settings| {
        without_cooldown(settings);
        settings.idempotency_mode = IdempotencyMode::Off;
    })
    .await;
    assert_eq!(storm_with_one_key(&off, 5).await, 0, "keys are not even recorded");
    let (alice, bob) = off.alice_and_bob().await;
    let key = new_key();
    let retries = (0..5)
        .map(|_| off.transfer_request(&alice, bob.wallet_id, 100, Some(&key)))
        .collect();
    fire_together(retries).await;
    assert_eq!(
        off.balance(alice.wallet_id).await,
        100_000 - 500,
        "every retry paid"
    );
}

#[tokio::test]
async fn read_decide_write_overdraws_the_intent_and_creates_money() {
    let naive = spawn_app(|settings| {
        without_cooldown(settings);
        settings.row_guard_mode = RowGuardMode::ReadDecideWrite;
        settings.naive_window_ms = 100;
        settings.signup_grant_minor = 300;
    })
    .await;
    let mut shown = false;
    for _ in 0..ATTEMPTS {
        let alice = naive.sign_up(&format!("a{}", new_key())).await;
        let bob = naive.sign_up(&format!("b{}", new_key())).await;
        let requests = (0..10)
            .map(|_| naive.transfer_request(&alice, bob.wallet_id, 100, Some(&new_key())))
            .collect();
        let responses = fire_together(requests).await;
        let paid = responses.iter().filter(|r| r.status() == 201).count();
        if paid > 3 && money_created(&naive).await > 0 {
            shown = true;
            break;
        }
    }
    assert!(shown, "read-decide-write never let more than the balance through");

    let guarded = spawn_app(|settings| {
        without_cooldown(settings);
        settings.signup_grant_minor = 300;
    })
    .await;
    let (alice, bob) = guarded.alice_and_bob().await;
    let requests = (0..10)
        .map(|_| guarded.transfer_request(&alice, bob.wallet_id, 100, Some(&new_key())))
        .collect();
    let responses = fire_together(requests).await;
    assert_eq!(responses.iter().filter(|r| r.status() == 201).count(), 3);
    assert_eq!(money_created(&guarded).await, 0);
    guarded.assert_invariants().await;
}

/// An unsafe mode without the explicit switch stops the server at start-up;
/// with it, /readyz reports the mode.
#[tokio::test]
async fn an_unsafe_mode_needs_the_explicit_switch_and_is_reported() {
    let settings = Settings {
        row_guard_mode: RowGuardMode::ReadDecideWrite,
        ..test_settings("postgres://unused@127.0.0.1/unused", "unused:")
    };
    let refused = Application::build(settings)
        .await
        .err()
        .expect("the server must refuse to start");
    assert!(
        refused.to_string().contains("allow_unsafe_demo_modes"),
        "{refused}"
    );

    let app = spawn_app(|settings| {
        settings.idempotency_mode = IdempotencyMode::CheckThenInsert;
        settings.allow_unsafe_demo_modes = true;
    })
    .await;
    let (_, ready) = app.admin_readiness().await;
    assert_eq!(ready["mode"]["safe"], false);
    assert_eq!(ready["mode"]["idempotency"], "check_then_insert");
    assert_eq!(ready["mode"]["unsafe_modes"][0], "idempotency check-then-insert");
    assert_eq!(ready["mode"]["inbox"], "atomic");

    let safe = spawn_app(|_| {}).await;
    assert_eq!(safe.admin_readiness().await.1["mode"]["safe"], true);
}
