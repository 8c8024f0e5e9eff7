//! A Redis Cluster master fails over under load: three masters with a
//! replica each, two instances on them, one master's replica cut off (as
//! a partition would), then that master killed and its replica promoted.
//!
//! The cooldown run holds a window for every user, loses the killed
//! master's windows in the failover, and sends every first request again,
//! several copies at once: whatever the lost windows let through must be
//! decided by PostgreSQL, a replay of the one transfer each key made.
//!
//! The commands run has the consumers apply and acknowledge a backlog on
//! the cut-off master: the failover forgets those acknowledgements, the
//! entries come back, and each command must still be applied once.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use layered_wallet::command::GROUP;
use layered_wallet::defense::cooldown::window_key;
use layered_wallet::domain::UserId;
use layered_wallet::settings::CooldownScope;
use layered_wallet::transfer::pipeline::COOLDOWN_ACTION;
use redis::AsyncCommands;
use uuid::Uuid;

use super::SETTLE_SECONDS_MAX;
use super::report::publish_row;
use crate::private_redis_cluster::PrivateRedisCluster;
use crate::{
    TestApp, TestUser, fire_together, new_key, on_redis_cluster, spawn_app, spawn_second_instance_with,
    transfer_command, with_commands,
};

/// The cluster's masters.
const MASTERS: usize = 3;
/// Users whose window is held when the master dies.
const HOLDERS: usize = 24;
/// Copies of each first request sent again at once after the failover.
const COPIES: usize = 5;
/// Users who keep transferring while the replica is promoted.
const DURING_USERS: usize = 6;
/// Long enough that no window expires during the run, however slow the
/// machine: a window missing afterwards was lost, not expired, and one
/// that survived still refuses once Redis is healthy again.
const WINDOW_MS: u64 = 600_000;
/// Commands in the backlog the consumers apply on the cut-off master.
const BACKLOG_COMMANDS: usize = 40;

/// What a Redis master failover did.
pub struct RedisFailoverReport {
    pub what: &'static str,
    pub promoted_after: Duration,
    pub measures: Vec<(&'static str, String)>,
    pub violations: Vec<String>,
}

impl RedisFailoverReport {
    pub fn assert_held(&self) {
        assert!(
            self.violations.is_empty(),
            "under {}:\n- {}\n{}",
            self.what,
            self.violations.join("\n- "),
            self.markdown_row()
        );
    }

    pub fn markdown_row(&self) -> String {
        let measures: Vec<String> = self
            .measures
            .iter()
            .map(|(name, value)| format!("{name}: {value}"))
            .collect();
        format!(
            "| {} | {:.1} s | {} | {} |",
            self.what,
            self.promoted_after.as_secs_f64(),
            measures.join("; "),
            if self.violations.is_empty() {
                "held"
            } else {
                "broken"
            }
        )
    }

    pub fn publish(&self, place: usize) {
        publish_row(
            "redis-failover-",
            REDIS_FAILOVER_REPORT_HEADER,
            place,
            &self.markdown_row(),
        );
    }
}

/// The Redis failover table's header, matching `markdown_row`.
pub const REDIS_FAILOVER_REPORT_HEADER: &str =
    "| run | replica promoted after | measured | invariants |\n|---|---|---|---|";

/// An instance on a private cluster, with `adjust` applied.
async fn instance_on(
    cluster: &PrivateRedisCluster,
    adjust: impl FnOnce(&mut layered_wallet::settings::Settings),
) -> TestApp {
    let urls = cluster.urls();
    spawn_app(|settings| {
        on_redis_cluster(settings, urls);
        adjust(settings);
    })
    .await
}

async fn cluster_connection(cluster: &PrivateRedisCluster) -> redis::cluster_async::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .expect("a cluster client")
        .get_async_connection()
        .await
        .expect("connect to the private cluster")
}

/// Starts the cluster (blocking work off the runtime).
async fn start_cluster() -> PrivateRedisCluster {
    tokio::task::spawn_blocking(|| PrivateRedisCluster::start(MASTERS))
        .await
        .expect("start the private Redis Cluster")
}

/// Kills master `victim`, waits for `replica`'s promotion, and returns
/// how long that took.
async fn fail_over(cluster: &mut PrivateRedisCluster, victim: usize, replica: usize) -> Duration {
    let killed_at = Instant::now();
    cluster.kill(victim);
    tokio::task::block_in_place(|| cluster.wait_for_promotion(replica, killed_at))
}

/// Cooldown windows across a master failover.
pub async fn run_cooldown_failover() -> RedisFailoverReport {
    let mut cluster = start_cluster().await;
    let first = instance_on(&cluster, |settings| settings.cooldown_ttl_ms = WINDOW_MS).await;
    let second = spawn_second_instance_with(&first, |_| {}).await;
    let instances = [&first, &second];
    let target = first.sign_up("target").await;
    let mut holders = Vec::new();
    for number in 0..HOLDERS {
        holders.push(first.sign_up(&format!("holder{number}")).await);
    }
    let mut during_users = Vec::new();
    for number in 0..DURING_USERS {
        during_users.push(first.sign_up(&format!("during{number}")).await);
    }
    let window_key = |user: &TestUser| {
        window_key(
            &first.redis_prefix,
            CooldownScope::UserAction,
            UserId(user.user_id),
            COOLDOWN_ACTION,
            "",
        )
    };
    let victim = cluster.master_of(cluster.slot_of(&window_key(&holders[0])));
    let replica = cluster.replica_of(victim);
    let on_victim: Vec<bool> = holders
        .iter()
        .map(|h| cluster.master_of(cluster.slot_of(&window_key(h))) == victim)
        .collect();
    let mut violations = Vec::new();

    // Every holder's first transfer, its window taken while the victim's
    // replica is cut off.
    cluster.pause_replication(victim);
    let mut first_transfers = Vec::new();
    for (number, holder) in holders.iter().enumerate() {
        let key = new_key();
        let response = instances[number % 2]
            .transfer_request(holder, target.wallet_id, 100, Some(&key))
            .send()
            .await
            .expect("a first transfer");
        assert_eq!(response.status(), 201, "a holder's first transfer");
        let body: serde_json::Value = response.json().await.expect("a transfer");
        first_transfers.push((key, body["id"].as_str().expect("an id").to_owned()));
    }

    // Others keep transferring, each with new keys, while the master dies
    // and its replica is promoted.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let during: Vec<_> = during_users
        .iter()
        .enumerate()
        .map(|(number, user)| {
            let app = instances[number % 2];
            let (client, url) = (app.client.clone(), app.url("/api/v1/transfers"));
            let (user, to, stop) = (user.clone(), target.wallet_id, stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let response = client
                        .post(&url)
                        .bearer_auth(&user.token)
                        .header("Idempotency-Key", new_key())
                        .json(&serde_json::json!({
                            "from_wallet_id": user.wallet_id, "to_wallet_id": to, "amount_minor": 1
                        }))
                        .send()
                        .await;
                    statuses.push(response.map_or(0, |r| r.status().as_u16()));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                statuses
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let promoted_after = fail_over(&mut cluster, victim, replica).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut during_answers: BTreeMap<u16, usize> = BTreeMap::new();
    for task in during {
        for status in task.await.expect("a user during the failover") {
            *during_answers.entry(status).or_insert(0) += 1;
        }
    }
    if during_answers
        .keys()
        .any(|status| *status >= 500 && *status != 503)
        || during_answers.contains_key(&0)
    {
        violations.push(format!(
            "answers during the failover other than 201, 429 and 503: {during_answers:?}"
        ));
    }

    // Which windows survived.
    let mut redis = cluster_connection(&cluster).await;
    let mut lost = 0;
    for (holder, on_victim) in holders.iter().zip(&on_victim) {
        let exists: bool = redis.exists(window_key(holder)).await.expect("EXISTS a window");
        lost += usize::from(!exists);
        if exists == *on_victim {
            violations.push(format!(
                "{}'s window {}, though it was {}on the killed master",
                holder.name,
                if exists { "survived" } else { "was lost" },
                if *on_victim { "" } else { "not " }
            ));
        }
    }

    // Every first request again, several copies at once, all holders at
    // once, across both instances, straight after the promotion. An
    // instance whose cluster connection is still finding the new master
    // cannot ask Redis, and the cooldown fails open (its policy here): a
    // copy of a surviving window may then reach PostgreSQL. The design
    // promises only that PostgreSQL decides it, as a replay; such copies
    // are counted against the instances' own count of fail-open passes.
    let fail_open_before = fail_open_passes(&instances).await;
    let copies = fire_copies(&instances, &holders, &first_transfers, target.wallet_id).await;
    let fail_open_during_copies = fail_open_passes(&instances).await - fail_open_before;
    let mut reached_postgres = 0;
    let mut through_surviving_windows = 0;
    for (holder, answers, on_victim) in copies.iter().zip(&on_victim).map(|((h, a), v)| (h, a, *v)) {
        for answer in answers {
            if answer.status == 429 {
                continue;
            }
            reached_postgres += 1;
            through_surviving_windows += usize::from(!on_victim);
            if !answer.replays_first_transfer() {
                violations.push(format!("{holder}'s copy was answered {answer}"));
            }
        }
    }
    if through_surviving_windows as u64 > fail_open_during_copies {
        violations.push(format!(
            "{through_surviving_windows} copies passed windows that survived, \
             but the instances let only {fail_open_during_copies} through without Redis"
        ));
    }

    // Once each instance reports Redis healthy, the surviving windows
    // refuse every copy again, before the database.
    if let Err(why) = wait_until_redis_healthy(&instances).await {
        violations.push(why);
    }
    let again = fire_copies(&instances, &holders, &first_transfers, target.wallet_id).await;
    for ((holder, answers), on_victim) in again.iter().zip(&on_victim) {
        if *on_victim {
            continue;
        }
        for answer in answers.iter().filter(|answer| answer.status != 429) {
            violations.push(format!(
                "{holder}'s window survived and Redis was healthy, yet a copy was answered {answer}"
            ));
        }
    }

    // Keyed double effects: each holder's wallet sent exactly its first
    // transfer.
    let holder_wallets: Vec<Uuid> = holders.iter().map(|h| h.wallet_id).collect();
    let holder_transfers: i64 =
        sqlx::query_scalar("SELECT count(*) FROM transfers WHERE from_wallet_id = ANY($1)")
            .bind(&holder_wallets)
            .fetch_one(&first.db)
            .await
            .expect("count the holders' transfers");
    let double_effects = usize::try_from(holder_transfers)
        .unwrap_or(0)
        .saturating_sub(HOLDERS);
    if holder_transfers != HOLDERS as i64 {
        violations.push(format!(
            "{HOLDERS} holders' keys made {holder_transfers} transfers"
        ));
    }
    violations.extend(crate::money_invariant_violations(&first.db).await);

    // The cooldown works again on the promoted master, by itself: new
    // users whose windows live there get one win per burst.
    let mut back = 0;
    let mut tried = 0;
    let mut number = 0;
    while tried < 3 {
        let user = first.sign_up(&format!("after{number}")).await;
        number += 1;
        if cluster.master_of(cluster.slot_of(&window_key(&user))) != replica {
            continue;
        }
        tried += 1;
        let burst = (0..COPIES)
            .map(|copy| instances[copy % 2].transfer_request(&user, target.wallet_id, 1, Some(&new_key())))
            .collect();
        let burst = fire_together(burst).await;
        let won = burst.iter().filter(|r| r.status() == 201).count();
        let refused = burst.iter().filter(|r| r.status() == 429).count();
        back += usize::from((won, refused) == (1, COPIES - 1));
    }
    if back != tried {
        violations.push(format!(
            "the cooldown held on the promoted master for {back} of {tried} bursts"
        ));
    }

    let victims = on_victim.iter().filter(|v| **v).count();
    RedisFailoverReport {
        what: "cooldown windows, master `kill -9` with its replica cut off",
        promoted_after,
        measures: vec![
            (
                "windows held",
                format!("{HOLDERS} ({victims} on the killed master)"),
            ),
            ("windows lost", lost.to_string()),
            (
                "first requests sent again",
                format!("{} ({COPIES} copies each)", HOLDERS * COPIES),
            ),
            (
                "copies that reached PostgreSQL",
                format!(
                    "{reached_postgres}, each a replay ({through_surviving_windows} past a surviving \
                     window while the cooldown failed open)"
                ),
            ),
            ("keyed double effects", double_effects.to_string()),
            (
                "answers during the promotion",
                during_answers
                    .iter()
                    .map(|(status, count)| format!("{count} × {status}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            (
                "cooldown back on the promoted master",
                format!("{back} of {tried} bursts"),
            ),
        ],
        violations,
    }
}

/// How one copy of a holder's first request was answered.
struct CopyAnswer {
    status: u16,
    replayed: bool,
    /// The body names the holder's first transfer.
    names_first_transfer: bool,
}

impl CopyAnswer {
    fn replays_first_transfer(&self) -> bool {
        self.status == 201 && self.replayed && self.names_first_transfer
    }
}

impl std::fmt::Display for CopyAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (a replay: {}, of its first transfer: {})",
            self.status, self.replayed, self.names_first_transfer
        )
    }
}

/// `COPIES` copies of every holder's first request at once, across both
/// instances; each holder's name with its copies' answers.
async fn fire_copies(
    instances: &[&TestApp; 2],
    holders: &[TestUser],
    first_transfers: &[(String, String)],
    target: Uuid,
) -> Vec<(String, Vec<CopyAnswer>)> {
    let requests = holders
        .iter()
        .zip(first_transfers)
        .flat_map(|(holder, (key, _))| {
            (0..COPIES).map(move |copy| instances[copy % 2].transfer_request(holder, target, 100, Some(key)))
        })
        .collect();
    let mut responses = fire_together(requests).await.into_iter();
    let mut answers = Vec::new();
    for (holder, (_, transfer_id)) in holders.iter().zip(first_transfers) {
        let mut copies = Vec::new();
        for response in responses.by_ref().take(COPIES) {
            let status = response.status().as_u16();
            let replayed = response.headers().get("idempotent-replayed").is_some();
            let body: serde_json::Value = response.json().await.unwrap_or_default();
            copies.push(CopyAnswer {
                status,
                replayed,
                names_first_transfer: body["id"].as_str() == Some(transfer_id.as_str()),
            });
        }
        answers.push((holder.name.clone(), copies));
    }
    answers
}

/// Requests the instances let through without asking Redis, by their
/// admin listeners' readiness reports, added up.
async fn fail_open_passes(instances: &[&TestApp; 2]) -> u64 {
    let mut passes = 0;
    for instance in instances {
        let report = readiness_report(instance).await;
        passes += report["cooldown_fail_open_passes"]
            .as_u64()
            .expect("the readiness report counts fail-open passes");
    }
    passes
}

async fn readiness_report(instance: &TestApp) -> serde_json::Value {
    instance
        .client
        .get(instance.admin_url("/readyz"))
        .send()
        .await
        .expect("the admin listener's /readyz")
        .json()
        .await
        .expect("a readiness report")
}

/// Waits, up to `SETTLE_SECONDS_MAX`, until every instance's admin
/// listener reports Redis `ok`.
async fn wait_until_redis_healthy(instances: &[&TestApp; 2]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
    loop {
        let mut healthy = 0;
        for instance in instances {
            healthy += usize::from(readiness_report(instance).await["redis"] == "ok");
        }
        if healthy == instances.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{healthy} of {} instances reported Redis healthy {SETTLE_SECONDS_MAX} s after the promotion",
                instances.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Command entries acknowledged on a master whose replica was cut off.
pub async fn run_commands_failover() -> RedisFailoverReport {
    let mut cluster = start_cluster().await;
    let mut violations = Vec::new();
    // This instance takes no commands: it signs people up and reads the
    // outcomes. The consumers start once the backlog is in place.
    let first = instance_on(&cluster, |_| {}).await;
    let streams = first.command_streams();
    let partitions = streams.partitions();
    // The partitions' groups, made before the cut so that the replicas
    // have them, as in a deployment that has run a while.
    let mut redis = cluster_connection(&cluster).await;
    for partition in 0..partitions {
        let _: () = redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(streams.stream(partition))
            .arg(GROUP)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut redis)
            .await
            .expect("create a partition's group");
    }
    let target = first.sign_up("target").await;
    let mut payers = Vec::new();
    for number in 0..4 {
        payers.push(first.sign_up(&format!("payer{number}")).await);
    }
    let mut commands = Vec::new();
    for number in 0..BACKLOG_COMMANDS {
        let command = transfer_command(
            payers[number % payers.len()].wallet_id,
            target.wallet_id,
            1 + number as i64,
        );
        let _: String = command
            .publication(&streams)
            .query_async(&mut redis)
            .await
            .expect("publish a command");
        commands.push(command);
    }
    // The master to kill holds the partition with the most entries: a
    // command's partition follows its payer's wallet, so a fixed choice
    // could hold none of them, and the failover would forget nothing.
    let mut busiest = (0, 0);
    for partition in 0..partitions {
        let length: usize = redis::cmd("XLEN")
            .arg(streams.stream(partition))
            .query_async(&mut redis)
            .await
            .expect("a partition's length");
        busiest = busiest.max((length, partition));
    }
    let victim = cluster.master_of(cluster.slot_of(&streams.stream(busiest.1)));
    let replica = cluster.replica_of(victim);
    tokio::task::block_in_place(|| cluster.wait_for_replication(victim));
    cluster.pause_replication(victim);
    let consumers = [
        spawn_second_instance_with(&first, with_commands).await,
        spawn_second_instance_with(&first, with_commands).await,
    ];
    for command in &commands {
        first.wait_for_outcome(&command.command_id).await;
    }
    let on_victim: Vec<u16> = (0..partitions)
        .filter(|&p| cluster.master_of(cluster.slot_of(&streams.stream(p))) == victim)
        .collect();
    let acknowledged_then_forgotten: usize = on_victim
        .iter()
        .map(|&p| tokio::task::block_in_place(|| cluster.replica_stream_length(replica, &streams.stream(p))))
        .sum();
    if acknowledged_then_forgotten == 0 {
        violations.push("the failover forgot no acknowledgement, so the run tested nothing".to_owned());
    }
    let promoted_after = fail_over(&mut cluster, victim, replica).await;

    // The forgotten entries come back to the consumers; each must be
    // found applied already, and acknowledged again.
    let deadline = Instant::now() + Duration::from_secs(SETTLE_SECONDS_MAX);
    let mut redis = cluster_connection(&cluster).await;
    loop {
        let mut left = 0;
        for partition in 0..partitions {
            let length: usize = redis::cmd("XLEN")
                .arg(streams.stream(partition))
                .query_async(&mut redis)
                .await
                .unwrap_or(usize::MAX);
            left += length;
        }
        if left == 0 {
            break;
        }
        if Instant::now() >= deadline {
            violations.push(format!(
                "{left} entries were still in the streams {SETTLE_SECONDS_MAX} s after the failover"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let transfers = first.transfer_count().await;
    if transfers != BACKLOG_COMMANDS as i64 {
        violations.push(format!("{BACKLOG_COMMANDS} commands made {transfers} transfers"));
    }
    for command in &commands {
        let outcome = first.wait_for_outcome(&command.command_id).await;
        if outcome["outcome"] != "applied" {
            violations.push(format!("command {} ended {outcome}", command.command_id));
        }
    }
    violations.extend(crate::money_invariant_violations(&first.db).await);
    drop(consumers);

    RedisFailoverReport {
        what: "command entries acknowledged on a master with its replica cut off, then `kill -9`",
        promoted_after,
        measures: vec![
            ("commands", BACKLOG_COMMANDS.to_string()),
            (
                "acknowledged on the killed master, forgotten by the failover",
                acknowledged_then_forgotten.to_string(),
            ),
            ("transfers made", transfers.to_string()),
        ],
        violations,
    }
}
