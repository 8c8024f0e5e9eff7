//! `transfer_batch()`, raced: many batches at once, from several
//! connections, beside single `transfer()` calls, with crossing transfers,
//! one hot wallet, overdraw storms and the same keys sent again in other
//! batches. Whatever the interleaving: no deadlock and no transfer undone
//! by an error, balances that match the ledger and the money invariants,
//! one effect per key, and every retry of a key answered with the same
//! bytes.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use uuid::Uuid;
use wallet_testkit::*;

/// One transfer as `transfer_batch()` and `transfer()` take it.
#[derive(Clone)]
struct Order {
    user: Uuid,
    token_hash: Vec<u8>,
    key: Uuid,
    from: Uuid,
    to: Uuid,
    amount_minor: i64,
}

impl Order {
    /// The same operation, the same fingerprint: a retry of a key sends
    /// the same order.
    fn fingerprint(&self) -> Vec<u8> {
        let text = format!("{}:{}:{}", self.from, self.to, self.amount_minor);
        Sha256::digest(text.as_bytes()).to_vec()
    }
}

/// One transfer's answer: its key, status and body, or an error.
type Answered = (Uuid, Option<i16>, Option<String>, Option<String>);

/// One row of `transfer_batch()`: the index, status and body.
type BatchRow = (i32, Option<i16>, Option<String>);

async fn send_batch(db: &sqlx::PgPool, orders: &[Order]) -> Vec<Answered> {
    let rows: Result<Vec<BatchRow>, _> = sqlx::query_as(
        "SELECT idx, (answer).response_status, (answer).response_body
           FROM transfer_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, 24, 2000, 3000)",
    )
    .bind(orders.iter().map(|order| order.user).collect::<Vec<_>>())
    .bind(
        orders
            .iter()
            .map(|order| order.token_hash.clone())
            .collect::<Vec<_>>(),
    )
    .bind(orders.iter().map(|order| order.key).collect::<Vec<_>>())
    .bind(orders.iter().map(Order::fingerprint).collect::<Vec<_>>())
    .bind(orders.iter().map(|_| Uuid::now_v7()).collect::<Vec<_>>())
    .bind(orders.iter().map(|order| order.from).collect::<Vec<_>>())
    .bind(orders.iter().map(|order| order.to).collect::<Vec<_>>())
    .bind(orders.iter().map(|order| order.amount_minor).collect::<Vec<_>>())
    .bind(orders.iter().map(|_| "0".repeat(32)).collect::<Vec<_>>())
    .fetch_all(db)
    .await;
    let rows = match rows {
        Ok(rows) => rows,
        Err(error) => {
            let code = sqlstate(&error);
            return orders
                .iter()
                .map(|order| (order.key, None, None, Some(code.clone())))
                .collect();
        }
    };
    assert_eq!(rows.len(), orders.len(), "one answer per transfer");
    rows.into_iter()
        .map(|(index, status, body)| {
            let order = &orders[usize::try_from(index - 1).expect("1-based")];
            (order.key, status, body, None)
        })
        .collect()
}

async fn send_one(db: &sqlx::PgPool, order: &Order) -> Answered {
    let answered: Result<(Option<i16>, Option<String>), _> = sqlx::query_as(
        "SELECT response_status, response_body
           FROM transfer($1, $2, $3, $4, 24, 2000, 3000, $5, $6, $7, $8, $9)",
    )
    .bind(order.user)
    .bind(&order.token_hash)
    .bind(order.key)
    .bind(order.fingerprint())
    .bind(Uuid::now_v7())
    .bind(order.from)
    .bind(order.to)
    .bind(order.amount_minor)
    .bind("0".repeat(32))
    .fetch_one(db)
    .await;
    match answered {
        Ok((status, body)) => (order.key, status, body, None),
        Err(error) => (order.key, None, None, Some(sqlstate(&error))),
    }
}

/// The SQLSTATE of a statement PostgreSQL refused; anything else is no
/// answer at all, which this test never expects.
fn sqlstate(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(database) => database.code().unwrap_or_default().into_owned(),
        other => panic!("the database did not answer: {other}"),
    }
}

/// `lock_not_available`: a wallet's lock was waited out, nothing changed.
/// A busy machine may see it; a deadlock (`40P01`) it never may.
const LOCK_WAITED_OUT: &str = "55P03";

/// Four accounts, each with its wallet and a live token.
async fn accounts(app: &TestApp) -> Vec<(Uuid, Uuid, Vec<u8>)> {
    let mut accounts = Vec::new();
    for name in ["ana", "ben", "cai", "dee"] {
        let user = app.sign_up(name).await;
        let hash = Sha256::digest(user.token.as_bytes()).to_vec();
        accounts.push((user.user_id, user.wallet_id, hash));
    }
    accounts
}

/// The orders of one round: crossing pairs, everyone paying the first
/// wallet (the hot one), and amounts that overdraw.
fn orders_of(accounts: &[(Uuid, Uuid, Vec<u8>)], round: usize) -> Vec<Order> {
    let mut orders = Vec::new();
    for (index, (user, from, token_hash)) in accounts.iter().enumerate() {
        for step in 1..accounts.len() {
            let to = accounts[(index + step) % accounts.len()].1;
            let amount_minor = match (round + index + step) % 5 {
                0 => 90_000,
                1 => 60_000,
                _ => 1_000 + i64::try_from(round * 7 + step).expect("small"),
            };
            orders.push(Order {
                user: *user,
                token_hash: token_hash.clone(),
                key: Uuid::new_v4(),
                from: *from,
                to,
                amount_minor,
            });
        }
    }
    orders
}

#[tokio::test]
async fn batches_raced_with_each_other_and_single_transfers_keep_every_key_and_every_balance_right() {
    let app = spawn_app(|_| {}).await;
    // Connections enough for every sender to be in the database at once.
    let db = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect_with((*app.db.connect_options()).clone())
        .await
        .expect("a pool of the test's own");
    let accounts = accounts(&app).await;
    let rounds: Vec<Vec<Order>> = (0..24).map(|round| orders_of(&accounts, round)).collect();
    // Each round is sent twice, in batches cut differently and from other
    // tasks, and every fourth order once more on its own: the same keys
    // meet each other in flight and across batches.
    let mut tasks = Vec::new();
    for (round, orders) in rounds.iter().enumerate() {
        for (cut, reversed) in [(3, false), (5, true)] {
            let (db, mut orders) = (db.clone(), orders.clone());
            // Reversed, the same pairs cross within and across batches.
            if reversed {
                orders.reverse();
            }
            let batches: Vec<Vec<Order>> = orders.chunks(cut + round % 2).map(<[Order]>::to_vec).collect();
            tasks.push(tokio::spawn(async move {
                let mut answers = Vec::new();
                for batch in batches {
                    answers.extend(send_batch(&db, &batch).await);
                }
                answers
            }));
        }
        let (db, singles) = (db.clone(), orders.iter().step_by(4).cloned().collect::<Vec<_>>());
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for order in &singles {
                answers.push(send_one(&db, order).await);
            }
            answers
        }));
    }
    let mut answers: Vec<Answered> = Vec::new();
    for task in tasks {
        answers.extend(task.await.expect("a sender"));
    }

    // No transfer was undone by an error but a lock waited out: no
    // deadlock, whatever crossed.
    let failures: Vec<_> = answers
        .iter()
        .filter_map(|answer| answer.3.clone())
        .filter(|code| code != LOCK_WAITED_OUT)
        .collect();
    assert!(failures.is_empty(), "transfers failed: {failures:?}");

    // One effect per key, and every answer to a key the same bytes: the
    // one stored, or a 409 while its first request was still in flight.
    let stored: HashMap<Uuid, (i16, Option<String>)> = sqlx::query_as::<_, (Uuid, i16, Option<String>)>(
        "SELECT key, response_status, response_body FROM idempotency_keys",
    )
    .fetch_all(&app.db)
    .await
    .expect("keys")
    .into_iter()
    .map(|(key, status, body)| (key, (status, body)))
    .collect();
    let decided: std::collections::HashSet<Uuid> = answers
        .iter()
        .filter(|answer| answer.3.is_none())
        .map(|answer| answer.0)
        .collect();
    assert_eq!(
        stored.len(),
        decided.len(),
        "every key answered was decided and stored once"
    );
    for (key, status, body, failure) in &answers {
        if failure.is_some() || *status == Some(409) {
            continue;
        }
        let (stored_status, stored_body) = &stored[key];
        assert_eq!(status, &Some(*stored_status), "{key}");
        if *stored_status == 201 {
            assert_eq!(body, stored_body, "a replay of {key} changed its bytes");
        }
    }
    let effects: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT idempotency_key, count(*) FROM transfers WHERE idempotency_key IS NOT NULL GROUP BY 1 HAVING count(*) > 1",
    )
    .fetch_all(&app.db)
    .await
    .expect("transfers");
    assert!(
        effects.is_empty(),
        "keys with more than one transfer: {effects:?}"
    );
    let accepted: i64 =
        sqlx::query_scalar("SELECT count(*) FROM idempotency_keys WHERE response_status = 201")
            .fetch_one(&app.db)
            .await
            .expect("accepted");
    let transfers: i64 = sqlx::query_scalar("SELECT count(*) FROM transfers")
        .fetch_one(&app.db)
        .await
        .expect("transfers");
    assert_eq!(
        transfers, accepted,
        "one transfer per accepted key, none without one"
    );

    // Balances: never negative, each its opening balance plus its ledger,
    // and no money made or lost.
    let damage: (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT money_created_minor, negative_balances, unexplained_balances, unbalanced_transfers
           FROM money_invariants()",
    )
    .fetch_one(&app.db)
    .await
    .expect("invariants");
    assert_eq!(
        damage,
        (0, 0, 0, 0),
        "money created, negative, unexplained, unbalanced"
    );
}

/// What one instance's `/metrics` says of its calls to PostgreSQL: the
/// transfers they carried, and how many calls there were.
async fn batch_sizes(app: &TestApp) -> (f64, f64) {
    let metrics = app.metrics().await;
    let value = |name: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} is missing from /metrics"))
    };
    (
        value("wallet_transfer_batch_transfers_sum "),
        value("wallet_transfer_batch_transfers_count "),
    )
}

/// Transfers admitted and not yet decided, on both instances.
async fn running(instances: &[&TestApp]) -> usize {
    let mut running = 0;
    for app in instances {
        running += app
            .metrics()
            .await
            .lines()
            .find_map(|line| line.strip_prefix("wallet_transfer_admission{state=\"running\"} "))
            .and_then(|value| value.trim().parse::<usize>().ok())
            .unwrap_or(0);
    }
    running
}

/// One order sent through the API: who pays whom, how much, its key.
struct Sent {
    payer: usize,
    payee: usize,
    amount_minor: i64,
    key: String,
}

/// The same race through the service: two instances, each with two
/// executors that batch up to eight transfers. The test holds every
/// wallet while the transfers arrive, so that they queue behind the
/// executors' first calls and go on in batches; each order is sent to
/// both instances at once under one key. Then every key is sent once more.
#[tokio::test]
async fn transfers_raced_through_two_instances_in_batches_keep_one_effect_per_key_and_exact_balances() {
    let adjust = |settings: &mut layered_wallet::settings::Settings| {
        without_cooldown(settings);
        settings.transfers_connections = 2;
        settings.transfers_batch_max = 8;
        // The first calls wait for the wallets the test holds.
        settings.wallet_lock_wait_ms_max = 30_000;
        settings.db_statement_timeout_ms = 60_000;
    };
    let first = spawn_app(adjust).await;
    let second = spawn_second_instance_with(&first, adjust).await;
    let mut users = Vec::new();
    for name in ["ana", "ben", "cai", "dee"] {
        users.push(first.sign_up(name).await);
    }
    let grant = first.settings.signup_grant_minor;

    // Crossing pairs both ways, everyone paying ana (the hot wallet), and
    // cai overdrawing: eight payments of 30% of the grant each.
    let mut orders = Vec::new();
    for payer in 0..users.len() {
        for payee in (0..users.len()).filter(|payee| *payee != payer) {
            for round in 0..3 {
                let amount_minor = 100 + i64::try_from(payer * 10 + payee + round).expect("small");
                orders.push((payer, payee, amount_minor));
            }
        }
    }
    orders.extend((0..8).map(|_| (2, 3, grant * 3 / 10)));
    let sent: Vec<Sent> = orders
        .into_iter()
        .map(|(payer, payee, amount_minor)| Sent {
            payer,
            payee,
            amount_minor,
            key: new_key(),
        })
        .collect();

    let wallets: Vec<Uuid> = users.iter().map(|user| user.wallet_id).collect();
    let mut holder = first.db.begin().await.expect("a transaction");
    sqlx::query("SELECT 1 FROM wallets WHERE id = ANY($1) ORDER BY id FOR UPDATE")
        .bind(&wallets)
        .execute(&mut *holder)
        .await
        .expect("every wallet held");
    let mut tasks = Vec::new();
    for order in &sent {
        for app in [&first, &second] {
            let request = app.transfer_request(
                &users[order.payer],
                users[order.payee].wallet_id,
                order.amount_minor,
                Some(&order.key),
            );
            let key = order.key.clone();
            tasks.push(tokio::spawn(async move {
                let response = request.send().await.expect("sent");
                let status = response.status().as_u16();
                (key, status, response.text().await.expect("a body"))
            }));
        }
    }
    // Let them all arrive, then let go of the wallets.
    for _ in 0..200 {
        if running(&[&first, &second]).await >= tasks.len() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    holder.commit().await.expect("the wallets let go");
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.expect("a request"));
    }

    // No deadlock, no failure: each answer is the transfer's own, or a
    // 409 while its copy on the other instance was in flight.
    let unexpected: Vec<_> = answers
        .iter()
        .filter(|(_, status, _)| ![201, 409, 422].contains(status))
        .collect();
    assert!(unexpected.is_empty(), "{unexpected:?}");

    // Every key once more, alone: the same status and the same bytes as
    // every earlier answer that was not a 409.
    let mut decided: HashMap<String, (u16, String)> = HashMap::new();
    for order in &sent {
        let retry = second
            .transfer(
                &users[order.payer],
                users[order.payee].wallet_id,
                order.amount_minor,
                Some(&order.key),
            )
            .await;
        let status = retry.status().as_u16();
        assert_eq!(retry.headers()["idempotent-replayed"], "true", "{}", order.key);
        decided.insert(order.key.clone(), (status, retry.text().await.expect("a body")));
    }
    for (key, status, body) in &answers {
        if *status != 409 {
            assert_eq!(
                &decided[key],
                &(*status, body.clone()),
                "a replay of {key} changed"
            );
        }
    }

    // One transfer per accepted key, and each balance exactly its grant
    // plus what the accepted answers say it received and sent.
    let accepted: Vec<&Sent> = sent.iter().filter(|order| decided[&order.key].0 == 201).collect();
    assert_eq!(
        first.transfer_count().await,
        i64::try_from(accepted.len()).expect("small")
    );
    assert!(
        sent.iter()
            .all(|order| [201, 422].contains(&decided[&order.key].0)),
        "every key was decided"
    );
    for (index, user) in users.iter().enumerate() {
        let received: i64 = accepted
            .iter()
            .filter(|order| order.payee == index)
            .map(|order| order.amount_minor)
            .sum();
        let paid: i64 = accepted
            .iter()
            .filter(|order| order.payer == index)
            .map(|order| order.amount_minor)
            .sum();
        assert_eq!(
            first.balance(user.wallet_id).await,
            grant + received - paid,
            "{}",
            user.name
        );
    }
    assert!(
        sent.iter()
            .filter(|order| order.payer == 2 && order.amount_minor == grant * 3 / 10)
            .any(|order| decided[&order.key].0 == 422),
        "the overdraw storm was refused in part"
    );
    first.assert_invariants().await;

    // And the queue did form batches.
    let mut carried = 0.0;
    let mut calls = 0.0;
    for app in [&first, &second] {
        let (sum, count) = batch_sizes(app).await;
        carried += sum;
        calls += count;
    }
    assert!(
        carried > calls,
        "{carried} transfers in {calls} calls: no batch formed"
    );
}
