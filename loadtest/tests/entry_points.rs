//! Short runs of the benchmarks of the other entry points (deposits,
//! commands, payouts) against a real instance, each checked against what
//! the database then holds: what a run reports must be what happened.

use wallet_loadtest::closed_loop::Load;
use wallet_loadtest::commands::{self, CommandArgs};
use wallet_loadtest::deposits::{self, DepositArgs};
use wallet_loadtest::payouts::{self, PayoutArgs, Phase};
use wallet_testkit::gateway::{Gateway, wallet_sim_binary};
use wallet_testkit::*;

/// Minor units the run's accounts received beyond their opening balances.
async fn received_beyond_opening(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(balance_minor - opening_balance_minor), 0)::bigint
           FROM wallets WHERE clearing_source IS NULL",
    )
    .fetch_one(&app.db)
    .await
    .expect("the balances")
}

/// Every 200 the deposit run counted is one credited event in the inbox,
/// and one minor unit in the users' wallets; nothing else was credited.
#[tokio::test]
async fn the_deposit_run_counts_what_the_inbox_credited() {
    let app = spawn_app(with_deposits).await;
    let report = deposits::run(&DepositArgs {
        targets: vec![app.address.clone()],
        provider_secret: PROVIDER_SECRET.into(),
        currency: "USD".into(),
        load: Load {
            users: 3,
            concurrency: 4,
            duration_s: 1.0,
        },
        answer_wait_ms: 10_000,
        json: false,
    })
    .await
    .expect("the run");
    let credited = report.credited.succeeded as i64;
    assert!(credited > 0, "nothing was credited: {report:?}");
    assert!(report.credited.other_answers.is_empty(), "{report:?}");
    let in_the_inbox: i64 =
        sqlx::query_scalar("SELECT count(*) FROM inbox WHERE source = 'provider' AND verdict = 'credited'")
            .fetch_one(&app.db)
            .await
            .expect("the inbox");
    assert_eq!(in_the_inbox, credited);
    assert_eq!(received_beyond_opening(&app).await, credited);
    assert_eq!(money_invariant_violations(&app.db).await, Vec::<String>::new());
}

/// The command run waits until every command it published has its outcome:
/// each applied once, the money moved between the users and conserved.
#[tokio::test]
async fn the_command_run_waits_for_every_outcome() {
    let app = spawn_app(with_commands).await;
    let report = commands::run(&CommandArgs {
        targets: vec![app.address.clone()],
        database_url: database_url_of(&app.db_options),
        redis_url: redis_url(),
        redis_prefix: app.redis_prefix.clone(),
        partitions: app.settings.commands_partitions,
        users: 4,
        commands: 200,
        publish_batch_commands: 64,
        drain_s_max: 120,
        json: false,
    })
    .await
    .expect("the run");
    assert_eq!(report.left, 0, "{report:?}");
    assert_eq!(report.verdicts, vec![("applied".to_owned(), 200)]);
    assert!(report.applied_per_s > 0.0);
    let transfers: i64 = sqlx::query_scalar("SELECT count(*) FROM transfers")
        .fetch_one(&app.db)
        .await
        .expect("the transfers");
    assert_eq!(transfers, 200, "each command took effect once");
    assert_eq!(received_beyond_opening(&app).await, 0, "commands only move money");
    assert_eq!(money_invariant_violations(&app.db).await, Vec::<String>::new());
}

/// Every payout the run saw accepted left the outbox, and the gateway's own
/// ledger holds exactly one sending for each.
#[tokio::test]
async fn the_payout_run_drains_the_outbox_once_per_payout() {
    let gateway = Gateway::start(&wallet_sim_binary(), &[]).await;
    let app = spawn_app(with_payouts(&gateway.url)).await;
    let report = payouts::run(&payout_args(&app, &gateway, Phase::Both))
        .await
        .expect("the run");
    let accepted = report.accepted.as_ref().expect("accepted").succeeded as i64;
    let sent = report.sent.as_ref().expect("sent");
    assert!(accepted > 0, "{report:?}");
    assert!(report.complete(), "{report:?}");
    assert_eq!(sent.left_in_outbox, 0, "{report:?}");
    assert!(
        sent.backlog <= accepted,
        "the backlog counts only what waited when the acceptance ended: {report:?}"
    );
    assert!(report.gateway_per_s.is_some_and(|per_s| per_s > 0.0));
    assert_eq!(
        app.payouts_by_state().await,
        vec![("settled".to_owned(), accepted)]
    );
    assert_eq!(app.outbox_rows().await, 0);
    assert_each_payout_sent_once(&app, &gateway).await;
    assert_eq!(money_invariant_violations(&app.db).await, Vec::<String>::new());
}

/// A backlog accepted while no instance dispatches waits in the outbox; an
/// instance that dispatches then sends all of it, once each, and the run
/// measures its sending from the first payout to leave to the last.
#[tokio::test]
async fn a_backlog_accepted_without_dispatchers_is_sent_whole_by_one_started_later() {
    let gateway = Gateway::start(&wallet_sim_binary(), &[]).await;
    let payouts_to = with_payouts(&gateway.url);
    let accepting = spawn_app(move |settings| {
        payouts_to(settings);
        settings.payout_dispatcher_enabled = false;
    })
    .await;
    let report = payouts::run(&payout_args(&accepting, &gateway, Phase::Accept))
        .await
        .expect("the acceptance");
    let accepted = report.accepted.as_ref().expect("accepted").succeeded as i64;
    assert!(accepted > 0, "{report:?}");
    assert!(
        report.sent.is_none() && report.gateway_per_s.is_none(),
        "{report:?}"
    );
    assert_eq!(accepting.outbox_rows().await, accepted, "nothing was sent yet");

    let sending =
        spawn_second_instance_with(&accepting, |settings| settings.payout_dispatcher_enabled = true).await;
    let report = payouts::run(&payout_args(&sending, &gateway, Phase::Send))
        .await
        .expect("the sending");
    let sent = report.sent.as_ref().expect("sent");
    assert!(report.accepted.is_none(), "{report:?}");
    assert_eq!((sent.backlog, sent.left_in_outbox), (accepted, 0), "{report:?}");
    assert_eq!(
        sending.payouts_by_state().await,
        vec![("settled".to_owned(), accepted)]
    );
    assert_each_payout_sent_once(&sending, &gateway).await;
    assert_eq!(
        money_invariant_violations(&sending.db).await,
        Vec::<String>::new()
    );
}

fn payout_args(app: &TestApp, gateway: &Gateway, phase: Phase) -> PayoutArgs {
    PayoutArgs {
        targets: vec![app.address.clone()],
        database_url: database_url_of(&app.db_options),
        gateway_url: gateway.url.clone(),
        phase,
        load: Load {
            users: 3,
            concurrency: 4,
            duration_s: 1.0,
        },
        drain_s_max: 120,
        json: false,
    }
}

/// The gateway's own ledger holds exactly one sending for each payout.
async fn assert_each_payout_sent_once(app: &TestApp, gateway: &Gateway) {
    let payout_ids: Vec<uuid::Uuid> = sqlx::query_scalar("SELECT id FROM payouts")
        .fetch_all(&app.db)
        .await
        .expect("the payouts");
    let sendings = wallet_sim::gateway::sendings_by_reference(&gateway.db)
        .await
        .expect("the gateway's ledger");
    for payout in payout_ids {
        let sent: Vec<_> = sendings
            .iter()
            .filter(|(reference, _, _)| *reference == payout.to_string())
            .collect();
        assert_eq!(sent.len(), 1, "payout {payout} reached the gateway");
        assert_eq!(sent[0].1, 1, "payout {payout} was sent once");
    }
}
