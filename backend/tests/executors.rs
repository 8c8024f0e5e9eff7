//! The executors that own a path's connections (`layered_wallet::executors`):
//! a thread that started its own hands its orders to them, several waiting
//! orders go in one call, two paths on one thread never share a queue, and
//! a thread without executors still gets its answer, from a connection of
//! the pool. Against the test PostgreSQL server; the calls only select.

use std::time::Duration;

use layered_wallet::executors::{BatchedCall, Bounds, Executors};
use sqlx::postgres::{PgConnection, PgPoolOptions, PgRow};
use sqlx::{PgPool, Row};
use wallet_testkit::*;

/// Answers each number with itself plus `offset`, and says how many
/// numbers its call carried.
struct AddOffset {
    offset: i32,
}

impl BatchedCall for AddOffset {
    type Order = i32;

    async fn one(&self, connection: &mut PgConnection, order: &i32) -> Result<PgRow, sqlx::Error> {
        sqlx::query("SELECT $1::int4 + $2::int4 AS answer, 1::int4 AS carried")
            .bind(*order)
            .bind(self.offset)
            .fetch_one(connection)
            .await
    }

    async fn many(
        &self,
        connection: &mut PgConnection,
        orders: &[i32],
    ) -> Result<Vec<Option<PgRow>>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT n + $2::int4 AS answer, cardinality($1::int4[]) AS carried
             FROM unnest($1::int4[]) WITH ORDINALITY AS t(n, place) ORDER BY place",
        )
        .bind(orders.to_vec())
        .bind(self.offset)
        .fetch_all(connection)
        .await?;
        Ok(rows.into_iter().map(Some).collect())
    }
}

const ORDERS: i32 = 40;
const BATCH_MAX: usize = 8;

async fn pool() -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&postgres_server_url())
        .await
        .unwrap_or_else(|error| {
            panic!("PostgreSQL must be reachable at TEST_DATABASE_URL ({error}); start it")
        })
}

fn executors(db: PgPool, offset: i32, sizes: &prometheus::Histogram) -> Executors<AddOffset> {
    let bounds = Bounds {
        // Two threads share two connections: one executor each.
        connections: 2,
        threads: 2,
        batch_max: BATCH_MAX,
        idle_check_after: Duration::from_secs(60),
        queue_max: 64,
    };
    Executors::new(db, AddOffset { offset }, bounds, sizes.clone())
}

fn sizes(name: &str) -> prometheus::Histogram {
    prometheus::Histogram::with_opts(prometheus::HistogramOpts::new(name, "orders a call carried"))
        .expect("a histogram")
}

/// Sends `ORDERS` orders at once and returns each answer with what its call
/// carried.
async fn send_together(executors: &Executors<AddOffset>) -> Vec<(i32, i32)> {
    let answers = futures::future::join_all((0..ORDERS).map(|order| executors.run(order))).await;
    answers
        .into_iter()
        .map(|answer| {
            let row = answer.unwrap_or_else(|failure| panic!("an order failed: {:?}", failure.error));
            (row.get("answer"), row.get("carried"))
        })
        .collect()
}

#[test]
fn a_threads_executors_answer_each_order_and_send_waiting_orders_together() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // A thread whose runtime takes local tasks, as an HTTP worker's does.
    let local = tokio::task::LocalSet::new();
    local.block_on(&runtime, async {
        let db = pool().await;
        let (first_sizes, second_sizes) = (sizes("first"), sizes("second"));
        let first = executors(db.clone(), 0, &first_sizes);
        let second = executors(db.clone(), 1_000, &second_sizes);
        // Asked twice, as a worker building its application for each listener.
        for executors in [&first, &first, &second] {
            executors.start_on_this_thread();
        }

        let answers = send_together(&first).await;
        let expected: Vec<i32> = (0..ORDERS).collect();
        assert_eq!(
            answers.iter().map(|(answer, _)| *answer).collect::<Vec<_>>(),
            expected
        );
        assert!(
            answers.iter().all(|(_, carried)| *carried as usize <= BATCH_MAX),
            "no call carries more than batch_max: {answers:?}"
        );
        assert!(
            answers.iter().any(|(_, carried)| *carried > 1),
            "orders waiting together go in one call: {answers:?}"
        );
        assert_eq!(
            first_sizes.get_sample_sum() as i32,
            ORDERS,
            "every order counted once"
        );
        assert!(first_sizes.get_sample_count() < ORDERS as u64);

        // The other path's queue on the same thread reaches its own call.
        let answers = send_together(&second).await;
        let expected: Vec<i32> = (1_000..1_000 + ORDERS).collect();
        assert_eq!(
            answers.iter().map(|(answer, _)| *answer).collect::<Vec<_>>(),
            expected
        );
        assert_eq!(second_sizes.get_sample_sum() as i32, ORDERS);
        assert_eq!(
            first_sizes.get_sample_sum() as i32,
            ORDERS,
            "nothing of the second path reached the first"
        );
    });
}

#[tokio::test]
async fn a_thread_without_executors_runs_each_order_alone_on_a_pooled_connection() {
    let sizes = sizes("none");
    let executors = executors(pool().await, 0, &sizes);
    let answers = send_together(&executors).await;
    assert_eq!(
        answers,
        (0..ORDERS).map(|order| (order, 1)).collect::<Vec<_>>(),
        "each order alone, answered"
    );
    assert_eq!(sizes.get_sample_count(), 0, "no executor ran");
}
