//! Transfer commands from a broker: published to real Redis Streams,
//! consumed by real instances in one consumer group, with consumers that
//! stall past their claim time and consumers that die holding a command,
//! asserting on the database afterwards.

use layered_wallet::command::transaction;
use secrecy::SecretString;
use wallet_testkit::*;

/// The value of one series on an instance's `/metrics`, 0 when absent.
async fn series(app: &TestApp, line_start: &str) -> f64 {
    app.metrics()
        .await
        .lines()
        .find(|line| line.starts_with(line_start))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn each_command_applies_once_across_two_instances_and_its_outcome_is_kept() {
    let first = spawn_app(with_commands).await;
    let second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;
    let commands: Vec<_> = (0..20)
        .map(|_| transfer_command(alice.wallet_id, bob.wallet_id, 100))
        .collect();
    for command in &commands {
        first.publish_command(command).await;
    }
    // The issuer publishes five of them again, as after a time-out.
    for command in &commands[..5] {
        first.publish_command(command).await;
    }
    for command in &commands {
        let outcome = first.wait_for_outcome(&command.command_id).await;
        assert_eq!(outcome["outcome"], "applied", "{outcome}");
        assert_eq!(outcome["issuer"], "payroll");
    }
    first.wait_until_nothing_pending().await;
    assert_eq!(first.transfer_count().await, 20);
    assert_eq!(first.balance(alice.wallet_id).await, 100_000 - 2_000);
    assert_eq!(first.balance(bob.wallet_id).await, 100_000 + 2_000);
    first.assert_invariants().await;

    let results = first.stream_entries(first.command_streams().results()).await;
    assert_eq!(results.len(), 25, "one result per delivery handled");
    let replayed = series(
        &first,
        "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}",
    )
    .await
        + series(
            &second,
            "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}",
        )
        .await;
    assert_eq!(replayed, 5.0, "the republished five were replayed by the inbox");
    let (status, _) = first.command_outcome("cmd_never_published").await;
    assert_eq!(status, 404);
}

/// One wallet's commands apply in the order they were published: the
/// first debit fits, the second no longer does, whichever instance holds
/// the partition.
#[tokio::test]
async fn one_wallets_commands_apply_in_order_and_a_refusal_is_an_outcome() {
    let first = spawn_app(with_commands).await;
    let _second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;
    let fits = transfer_command(alice.wallet_id, bob.wallet_id, 60_000);
    let too_much = transfer_command(alice.wallet_id, bob.wallet_id, 50_000);
    let small = transfer_command(alice.wallet_id, bob.wallet_id, 40_000);
    for command in [&fits, &too_much, &small] {
        first.publish_command(command).await;
    }
    assert_eq!(
        first.wait_for_outcome(&fits.command_id).await["outcome"],
        "applied"
    );
    let refused = first.wait_for_outcome(&too_much.command_id).await;
    assert_eq!(refused["outcome"], "insufficient_funds", "{refused}");
    assert_eq!(
        first.wait_for_outcome(&small.command_id).await["outcome"],
        "applied"
    );
    first.wait_until_nothing_pending().await;
    assert!(
        first
            .stream_entries(first.command_streams().dead_letters())
            .await
            .is_empty(),
        "a refusal is not poison"
    );
    assert_eq!(first.balance(alice.wallet_id).await, 0);
    first.assert_invariants().await;
}

/// A broker may choose its entry ids (`XADD stream <id> …`), and so a
/// command's time. One dated a day ahead would stay young past its claim's
/// sweep, so it is refused and the refusal stored; one within the clock
/// tolerance is applied.
#[tokio::test]
async fn a_command_published_past_the_future_tolerance_is_refused_and_the_refusal_kept() {
    let app = spawn_app(with_commands).await;
    let (alice, bob) = app.alice_and_bob().await;
    assert_eq!(app.settings.commands_future_tolerance_s, 300);
    let now_ms = chrono::Utc::now().timestamp_millis();
    let within = transfer_command(alice.wallet_id, bob.wallet_id, 1_000);
    let ahead = transfer_command(alice.wallet_id, bob.wallet_id, 2_000);
    // One stream (one source wallet): its ids must rise.
    app.publish_command_as(&within, &format!("{}-0", now_ms + 60_000))
        .await;
    app.publish_command_as(&ahead, &format!("{}-0", now_ms + 86_400_000))
        .await;
    assert_eq!(
        app.wait_for_outcome(&within.command_id).await["outcome"],
        "applied"
    );
    let refused = app.wait_for_outcome(&ahead.command_id).await;
    assert_eq!(refused["outcome"], "published_in_future", "{refused}");
    assert!(refused.get("transfer_id").is_none(), "{refused}");
    // Published again, it gets the stored refusal.
    app.publish_command_as(&ahead, &format!("{}-0", now_ms + 86_400_001))
        .await;
    app.wait_until_nothing_pending().await;
    let results = app.stream_entries(app.command_streams().results()).await;
    let refusals = results
        .iter()
        .filter(|entry| entry["command_id"] == ahead.command_id)
        .inspect(|entry| assert_eq!(entry["outcome"], "published_in_future"))
        .count();
    assert_eq!(refusals, 2, "{results:?}");
    let stored: String =
        sqlx::query_scalar("SELECT verdict FROM inbox WHERE source = 'broker' AND event_id = $1")
            .bind(&ahead.command_id)
            .fetch_one(&app.db)
            .await
            .expect("the refusal's inbox row");
    assert_eq!(stored, "published_in_future");
    assert_eq!(
        app.transfer_count().await,
        1,
        "only the command within the tolerance"
    );
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 1_000);
    assert_eq!(app.balance(bob.wallet_id).await, 100_000 + 1_000);
    app.assert_invariants().await;
}

/// Consumers scale out: an instance alone works every partition; when a
/// second one starts, the first gives up partitions until each holds its
/// share.
#[tokio::test]
async fn the_partitions_are_shared_among_the_live_consumers() {
    let first = spawn_app(with_commands).await;
    assert_eq!(first.settings.commands_partitions, 2);
    first
        .wait_for_lease_holders("every partition held by the one instance", |holders| {
            holders.iter().all(Option::is_some) && holders.windows(2).all(|pair| pair[0] == pair[1])
        })
        .await;
    let _second = spawn_second_instance(&first).await;
    first
        .wait_for_lease_holders("one partition held by each instance", |holders| {
            holders.iter().all(Option::is_some) && holders[0] != holders[1]
        })
        .await;
    // Still shared a little later: the two do not take turns.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let holders = first.lease_holders().await;
    assert!(
        holders.iter().all(Option::is_some) && holders[0] != holders[1],
        "{holders:?}"
    );
}

/// The visibility timeout by construction: the first consumer's
/// transaction takes longer than the claim time, so the other instance
/// claims the command and runs it at the same time. One effect.
#[tokio::test]
async fn a_consumer_that_stalls_past_the_claim_time_runs_twice_and_applies_once() {
    let adjust = |settings: &mut layered_wallet::settings::Settings| {
        with_commands(settings);
        settings.commands_claim_idle_ms = 500;
        settings.inbox_wait_ms_max = 8_000;
        settings.db_statement_timeout_ms = 15_000;
    };
    let first = spawn_app(adjust).await;
    let second = spawn_second_instance(&first).await;
    let (alice, bob) = first.alice_and_bob().await;
    // Each ledger entry takes a second to write: the transaction holds the
    // command for two, four times the claim time.
    first.slow_down_ledger_writes(1).await;
    let command = transfer_command(alice.wallet_id, bob.wallet_id, 1_000);
    first.publish_command(&command).await;
    let outcome = first.wait_for_outcome(&command.command_id).await;
    assert_eq!(outcome["outcome"], "applied");
    first.wait_until_nothing_pending().await;

    let claimed = series(&first, "wallet_commands_claimed_total").await
        + series(&second, "wallet_commands_claimed_total").await;
    assert!(
        claimed >= 1.0,
        "the stalled command was claimed by another consumer"
    );
    let replayed = series(
        &first,
        "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}",
    )
    .await
        + series(
            &second,
            "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}",
        )
        .await;
    assert!(replayed >= 1.0, "the second holder only acknowledged it");
    assert_eq!(first.transfer_count().await, 1);
    assert_eq!(first.balance(alice.wallet_id).await, 100_000 - 1_000);
    first.assert_invariants().await;
}

/// A consumer that lost its partition's lease may still be waiting in a
/// read (`XREADGROUP … BLOCK`), sent before it stalled: Redis gives it the
/// next entry, and the one behind goes to the holder. Made exactly so: a
/// consumer without the lease waits on the stream ahead of the holder, and
/// two commands of one wallet are published at once. The holder claims the
/// first before it applies the second: the first fits, the second no
/// longer does.
#[tokio::test]
async fn an_entry_read_by_a_consumer_without_the_lease_still_applies_before_those_behind_it() {
    let app = spawn_app(with_commands).await;
    let (alice, bob) = app.alice_and_bob().await;
    let streams = app.command_streams();
    let stream = streams.stream_for(layered_wallet::domain::WalletId(alice.wallet_id));
    app.wait_for_lease_holders("every partition held", |holders| {
        holders.iter().all(Option::is_some)
    })
    .await;
    let stalled = format!("stalled-{}", uuid::Uuid::new_v4().simple());
    let waiting = {
        let (stream, stalled) = (stream.clone(), stalled.clone());
        tokio::task::spawn_blocking(move || {
            let mut conn = redis::Client::open(redis_url())
                .and_then(|client| client.get_connection())
                .expect("a connection to Redis");
            redis::cmd("CLIENT")
                .arg("SETNAME")
                .arg(&stalled)
                .query::<()>(&mut conn)
                .expect("CLIENT SETNAME");
            let reply: layered_wallet::feed::XreadReply = redis::cmd("XREADGROUP")
                .arg("GROUP")
                .arg(layered_wallet::command::GROUP)
                .arg(&stalled)
                .arg("COUNT")
                .arg(1)
                .arg("BLOCK")
                .arg(30_000)
                .arg("STREAMS")
                .arg(&stream)
                .arg(">")
                .query(&mut conn)
                .expect("XREADGROUP");
            reply
                .into_iter()
                .flatten()
                .flat_map(|(_, entries)| entries.into_iter().map(|(id, _)| id))
                .collect::<Vec<String>>()
        })
    };
    let mut conn = redis::Client::open(redis_url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    for _ in 0..300 {
        let clients: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut conn)
            .await
            .expect("CLIENT LIST");
        if clients
            .lines()
            .any(|line| line.contains(&format!("name={stalled} ")) && line.contains("cmd=xreadgroup"))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    // The holder's read, sent before the other one, runs out after
    // `commands_read_wait_ms`: the next one waits behind the other one.
    let read_wait = std::time::Duration::from_millis(app.settings.commands_read_wait_ms);
    tokio::time::sleep(3 * read_wait).await;

    let fits = transfer_command(alice.wallet_id, bob.wallet_id, 60_000);
    let too_much = transfer_command(alice.wallet_id, bob.wallet_id, 50_000);
    let (fits_id, _): (String, String) = redis::pipe()
        .atomic()
        .add_command(fits.publication(&streams))
        .add_command(too_much.publication(&streams))
        .query_async(&mut conn)
        .await
        .expect("XADD");
    assert_eq!(waiting.await.expect("the read"), [fits_id]);
    assert_eq!(app.wait_for_outcome(&fits.command_id).await["outcome"], "applied");
    let refused = app.wait_for_outcome(&too_much.command_id).await;
    assert_eq!(refused["outcome"], "insufficient_funds", "{refused}");
    app.wait_until_nothing_pending().await;
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 60_000);
    app.assert_invariants().await;
}

/// A consumer killed after its commit and before its `XACK`: the command
/// is applied in PostgreSQL and still pending in Redis. The state is made
/// exactly so (the consumer's own transaction, then no acknowledgement),
/// and a live instance claims it: no second effect.
#[tokio::test]
async fn a_command_committed_but_never_acknowledged_is_redelivered_without_a_second_effect() {
    let first = spawn_app(|_| {}).await;
    let (alice, bob) = first.alice_and_bob().await;
    let command = transfer_command(alice.wallet_id, bob.wallet_id, 2_500);
    let mut settings = first.settings.clone();
    with_commands(&mut settings);
    settings.commands_claim_idle_ms = 300;
    let stream = first.command_streams().stream_for(command.from);
    let entry_id = first.publish_command(&command).await;
    assert_eq!(
        first
            .take_as_a_consumer_that_dies(&stream, "killed-after-commit")
            .await,
        std::slice::from_ref(&entry_id)
    );
    let config = settings.clone().validate().expect("valid settings");
    let published = layered_wallet::command::published_at(&entry_id).expect("a stream id");
    let mut connection = first.db.acquire().await.expect("a connection");
    let applied = transaction::apply(&mut connection, &config, &command, published, None)
        .await
        .expect("applied");
    drop(connection);
    assert_eq!(applied.verdict, "applied");
    assert_eq!(first.transfer_count().await, 1);

    let mut consumer = spawn_with(settings, first.db_options.clone()).await;
    consumer.mark_second_instance();
    consumer.wait_until_nothing_pending().await;
    assert_eq!(
        series(
            &consumer,
            "wallet_decisions_total{entry_point=\"command\",layer=\"inbox\",outcome=\"replayed\"}"
        )
        .await,
        1.0
    );
    assert_eq!(first.transfer_count().await, 1);
    assert_eq!(first.balance(alice.wallet_id).await, 100_000 - 2_500);
    first.assert_invariants().await;
}

/// Poison: an entry that is not a command is dead-lettered at once, one
/// delivered too often is dead-lettered with its count, and neither blocks
/// the commands behind it.
#[tokio::test]
async fn poison_entries_are_dead_lettered_and_never_block_their_partition() {
    let first = spawn_app(|_| {}).await;
    let (alice, bob) = first.alice_and_bob().await;
    let mut settings = first.settings.clone();
    with_commands(&mut settings);
    settings.commands_claim_idle_ms = 300;
    settings.commands_deliveries_max = 3;
    let streams = first.command_streams();
    let stream = streams.stream_for(layered_wallet::domain::WalletId(alice.wallet_id));

    // Delivered ten times to consumers that died each time.
    let worn = transfer_command(alice.wallet_id, bob.wallet_id, 100);
    let worn_id = first.publish_command(&worn).await;
    first.take_as_a_consumer_that_dies(&stream, "crashed").await;
    first.set_deliveries(&stream, "crashed", &worn_id, 10).await;
    // Not a command at all.
    first
        .publish_fields(
            stream.clone(),
            &[("command_id", "cmd_garbled".into()), ("amount", "12".into())],
        )
        .await;
    let behind = transfer_command(alice.wallet_id, bob.wallet_id, 300);
    first.publish_command(&behind).await;

    let mut consumer = spawn_with(settings, first.db_options.clone()).await;
    consumer.mark_second_instance();
    assert_eq!(
        consumer.wait_for_outcome(&behind.command_id).await["outcome"],
        "applied"
    );
    let worn_outcome = consumer.wait_for_outcome(&worn.command_id).await;
    assert_eq!(worn_outcome["outcome"], "dead_lettered", "{worn_outcome}");
    consumer.wait_until_nothing_pending().await;

    let dead = first.stream_entries(streams.dead_letters()).await;
    assert_eq!(dead.len(), 2, "{dead:?}");
    let worn_letter = dead
        .iter()
        .find(|letter| letter["command.command_id"] == worn.command_id)
        .expect("the worn command's dead letter");
    // Ten deliveries before, then the claim and the read: each counts.
    let deliveries: u32 = worn_letter["deliveries"].parse().expect("a count");
    assert!(deliveries > 10, "{dead:?}");
    assert_eq!(
        worn_letter["reason"],
        format!("delivered {deliveries} times without an outcome")
    );
    let garbled = dead
        .iter()
        .find(|letter| letter["command.command_id"] == "cmd_garbled")
        .expect("the garbled entry's dead letter");
    assert!(garbled["reason"].contains("not a field"), "{dead:?}");
    assert_eq!(first.transfer_count().await, 1, "only the command behind them");
    assert_eq!(first.balance(bob.wallet_id).await, 100_000 + 300);
    first.assert_invariants().await;
}

/// The commands' Redis as deploy/ ships it, started the way a deployment
/// starts it: the service runs on it as `wallet` (its cooldown, its feed,
/// its consumers), and a broker signed in as `broker` publishes a command
/// and reads its result, and can do nothing else. Nobody who has not
/// signed in can do anything.
#[tokio::test]
async fn the_shipped_acl_lets_the_broker_publish_commands_and_read_results_and_nothing_else() {
    let redis = ShippedCommandsRedis::start();
    let app = spawn_app(|settings| {
        with_commands(settings);
        settings.redis_url = SecretString::from(redis.url_as(Some("wallet")));
        settings.redis_key_prefix = ShippedCommandsRedis::KEY_PREFIX.into();
    })
    .await;
    let (alice, bob) = app.alice_and_bob().await;
    let paid = app
        .transfer_request(&alice, bob.wallet_id, 100, Some(&new_key()))
        .send()
        .await
        .expect("sent");
    assert_eq!(paid.status(), 201, "the service's own keys are its own");

    let mut broker = redis.connect(Some("broker")).await;
    let streams = app.command_streams();
    let command = transfer_command(alice.wallet_id, bob.wallet_id, 250);
    let _: String = command
        .publication(&streams)
        .query_async(&mut broker)
        .await
        .expect("the broker publishes a command");
    let outcome = app.wait_for_outcome(&command.command_id).await;
    assert_eq!(outcome["outcome"], "applied", "{outcome}");
    let results: Vec<(String, Vec<(String, String)>)> = redis::cmd("XRANGE")
        .arg(streams.results())
        .arg("-")
        .arg("+")
        .query_async(&mut broker)
        .await
        .expect("the broker reads the results");
    assert!(
        results.iter().any(|(_, fields)| fields
            .iter()
            .any(|(_, value)| value.contains(&command.command_id))),
        "{results:?}"
    );

    refuses_the_broker_everything_else(&mut broker, &streams, &alice).await;
    refuses_whoever_has_not_signed_in(&redis).await;

    // The one command applied once, beside the one transfer.
    assert_eq!(app.transfer_count().await, 2);
    assert_eq!(app.balance(alice.wallet_id).await, 100_000 - 350);
    assert_eq!(app.balance(bob.wallet_id).await, 100_000 + 350);
    app.assert_invariants().await;
}

/// What the shipped ACL refuses the broker: anything but appending to a
/// command stream and reading the results.
async fn refuses_the_broker_everything_else(
    broker: &mut redis::aio::MultiplexedConnection,
    streams: &layered_wallet::command::Streams,
    alice: &TestUser,
) {
    let cooldown_key = format!(
        "{}cooldown:{{{}}}:transfer",
        ShippedCommandsRedis::KEY_PREFIX,
        alice.user_id
    );
    let mut forbidden = vec![
        (
            "set a cooldown key",
            redis::cmd("SET").arg(&cooldown_key).arg("1").clone(),
        ),
        (
            "read a cooldown key",
            redis::cmd("GET").arg(&cooldown_key).clone(),
        ),
        (
            "read a partition's lease",
            redis::cmd("GET").arg(streams.lease(0)).clone(),
        ),
        (
            "read the commands",
            redis::cmd("XRANGE")
                .arg(streams.stream(0))
                .arg("-")
                .arg("+")
                .clone(),
        ),
        (
            "forge a result",
            redis::cmd("XADD")
                .arg(streams.results())
                .arg("*")
                .arg("outcome")
                .arg("applied")
                .clone(),
        ),
        (
            "delete a stream",
            redis::cmd("DEL").arg(streams.stream(0)).clone(),
        ),
        ("list the keys", redis::cmd("KEYS").arg("*").clone()),
        (
            "read the configuration",
            redis::cmd("CONFIG").arg("GET").arg("*").clone(),
        ),
    ];
    for (what, command) in &mut forbidden {
        let refused = command.query_async::<redis::Value>(broker).await.expect_err(what);
        assert_eq!(refused.code(), Some("NOPERM"), "{what}: {refused}");
    }
}

async fn refuses_whoever_has_not_signed_in(redis: &ShippedCommandsRedis) {
    let anonymous = redis::Client::open(redis.url_as(None))
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await;
    let refused = match anonymous {
        Ok(mut connection) => redis::cmd("PING")
            .query_async::<String>(&mut connection)
            .await
            .expect_err("nobody signed in may ping"),
        Err(error) => error,
    };
    assert!(refused.to_string().contains("NOAUTH"), "{refused}");
}

/// A backlog the consumers apply a batch at a time: commands spread over
/// every partition, some published twice, wallets paying each other both
/// ways (their batches lock the same wallets from two partitions at
/// once), an overdraw storm on one wallet, and an entry that is no command
/// in the middle of the storm's batch. Each command applies once, in its
/// wallet's order, and the database says so.
#[tokio::test]
async fn a_backlog_applied_in_batches_applies_each_command_once_and_exactly() {
    let mut first = spawn_app(|_| {}).await;
    let names = ["alice", "bob", "carol", "dave", "erin", "frank"];
    let mut wallets = Vec::new();
    for name in names {
        wallets.push(first.sign_up(name).await.wallet_id);
    }
    let [alice, bob, carol, dave, erin, frank] = wallets[..] else {
        unreachable!()
    };
    let streams = first.command_streams();

    // Crossing pairs, both ways, forty commands each way, every one fits;
    // the storm: twelve debits of 15,000 from 100,000, so the first six
    // apply and the other six are refused.
    let mut commands = Vec::new();
    for round in 0..40 {
        commands.push(transfer_command(alice, bob, 1_000 + round));
        commands.push(transfer_command(bob, alice, 700));
        commands.push(transfer_command(carol, dave, 300));
        commands.push(transfer_command(dave, carol, 500 + round));
        if round < 12 {
            commands.push(transfer_command(erin, frank, 15_000));
        }
    }
    let mut published = std::collections::HashMap::<String, usize>::new();
    for (i, command) in commands.iter().enumerate() {
        first.publish_command(command).await;
        *published.entry(command.command_id.clone()).or_default() += 1;
        // Every fifth one published again at once, as after a time-out.
        if i % 5 == 0 {
            first.publish_command(command).await;
            *published.entry(command.command_id.clone()).or_default() += 1;
        }
        // An entry that is no command, among the storm's.
        if i == 20 {
            first
                .publish_fields(
                    streams.stream_for(layered_wallet::domain::WalletId(erin)),
                    &[
                        ("command_id", "cmd_garbled_in_a_batch".into()),
                        ("amount", "12".into()),
                    ],
                )
                .await;
        }
    }

    let mut settings = first.settings.clone();
    with_commands(&mut settings);
    // A read batch of 16 goes in calls of at most 5: a command published
    // again may fall in the same call or in a later one.
    settings.commands_apply_batch_max = 5;
    let mut consumer = spawn_with(settings, first.db_options.clone()).await;
    consumer.mark_second_instance();
    let mut other = spawn_second_instance(&consumer).await;
    for command in &commands {
        consumer.wait_for_outcome(&command.command_id).await;
    }
    consumer.wait_until_nothing_pending().await;

    // Each command once: one stored outcome, one transfer per applied one.
    let storm: Vec<_> = commands.iter().filter(|c| c.from.0 == erin).collect();
    for (i, command) in storm.iter().enumerate() {
        let outcome = first.wait_for_outcome(&command.command_id).await;
        let expected = if i < 6 { "applied" } else { "insufficient_funds" };
        assert_eq!(outcome["outcome"], expected, "storm command {i}: {outcome}");
    }
    let applied = (commands.len() - 6) as i64;
    let (outcomes, applied_outcomes, distinct_transfers): (i64, i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE verdict = 'applied'), count(DISTINCT transfer_id)
         FROM inbox WHERE source = 'broker' AND event_id LIKE 'cmd\\_%' AND event_id <> 'cmd_garbled_in_a_batch'",
    )
    .fetch_one(&first.db)
    .await
    .expect("the inbox");
    assert_eq!(outcomes, commands.len() as i64, "one outcome per command id");
    assert_eq!(applied_outcomes, applied);
    assert_eq!(distinct_transfers, applied, "one transfer per applied command");
    assert_eq!(first.transfer_count().await, applied);

    // Exact balances, each explained by the ledger.
    let sum = |from: uuid::Uuid, to: uuid::Uuid| -> i64 {
        commands
            .iter()
            .filter(|c| c.from.0 == from && c.to.0 == to)
            .map(|c| c.amount_minor)
            .sum()
    };
    let storm_paid = 6 * 15_000;
    let expected = [
        (alice, sum(bob, alice) - sum(alice, bob)),
        (bob, sum(alice, bob) - sum(bob, alice)),
        (carol, sum(dave, carol) - sum(carol, dave)),
        (dave, sum(carol, dave) - sum(dave, carol)),
        (erin, -storm_paid),
        (frank, storm_paid),
    ];
    for (wallet, change) in expected {
        assert_eq!(first.balance(wallet).await, 100_000 + change);
        let ledger: i64 = sqlx::query_scalar(
            "SELECT coalesce(sum(amount_minor), 0)::bigint FROM ledger_entries WHERE wallet_id = $1",
        )
        .bind(wallet)
        .fetch_one(&first.db)
        .await
        .expect("the ledger");
        assert_eq!(ledger, change);
    }
    first.assert_invariants().await;

    // One result per delivery handled, each the same bytes as the stored
    // outcome; the entry that was no command was dead-lettered alone.
    let results = first.stream_entries(streams.results()).await;
    for (command_id, times) in &published {
        let stored = first.wait_for_outcome(command_id).await;
        let mine: Vec<_> = results
            .iter()
            .filter(|result| &result["command_id"] == command_id)
            .collect();
        assert_eq!(mine.len(), *times, "{command_id}: {mine:?}");
        for result in mine {
            let body: serde_json::Value = serde_json::from_str(&result["result"]).expect("a result body");
            assert_eq!(body, stored, "{command_id}");
        }
    }
    let dead = first.stream_entries(streams.dead_letters()).await;
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0]["command.command_id"], "cmd_garbled_in_a_batch");

    // No batch deadlocked another: PostgreSQL's count, which each server
    // connection flushes as it closes.
    for app in [&mut consumer, &mut other, &mut first] {
        app.kill().await;
    }
    for _ in 0..300 {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND application_name = 'layered-wallet'",
        )
        .fetch_one(&first.db)
        .await
        .expect("the database's connections");
        if open == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let deadlocks: i64 =
        sqlx::query_scalar("SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()")
            .fetch_one(&first.db)
            .await
            .expect("the database's statistics");
    assert_eq!(deadlocks, 0);
}
