//! Executors that own their PostgreSQL connections, for a path whose calls
//! can go to the database together. Transfers use them
//! (`transfer/transaction.rs` says which call).
//!
//! Why a path owns its connections: a connection borrowed from the pool
//! for each call costs two round trips besides the call, the check at
//! checkout and sqlx's check when it goes back. An executor keeps its
//! connection, so under load a call is one round trip and nothing else.
//! A connection idle for `idle_check_after` or longer is still checked
//! before use: one that broke while idle (a restart, a proxy's idle
//! time-out) is replaced before any work is sent down it, and the caller
//! gets a clean answer instead of "outcome unknown".
//!
//! Why together: orders that arrive while the executors are busy wait in
//! the queue; the next executor free takes every one waiting, up to
//! `batch_max`, and sends them in one call. It never waits for more to
//! arrive: one order alone goes at once, alone. What a batch shares is the
//! round trip and the commit; each order keeps its own answer.
//!
//! What each order is told when something fails:
//! - no connection could be had: nothing was sent (`may_have_committed`
//!   false);
//! - the batch's call was refused as a whole by PostgreSQL (a lock waited
//!   out, a statement time-out, any one order's error): the transaction
//!   rolled back, so each order is run again alone, and gets its own
//!   answer;
//! - one order was left out of the batch (`None` from `many`): it is run
//!   alone after it;
//! - the connection broke after the call was sent: the batch may have
//!   committed, and every order in it is told so.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::{Connection, PgPool, Postgres};
use tokio::sync::{Mutex, mpsc, oneshot};

/// How a path's orders go to PostgreSQL: one alone, or many in one call.
pub trait BatchedCall: Send + Sync + 'static {
    type Order: Send + Sync + 'static;

    /// One order in one call: its row.
    fn one<'c>(
        &'c self,
        connection: &'c mut PgConnection,
        order: &'c Self::Order,
    ) -> impl Future<Output = Result<PgRow, sqlx::Error>> + Send + 'c;

    /// Many orders in one call and one transaction: each order's row, in
    /// the orders' order, or `None` for an order the call left out (nothing
    /// of it was written), which is then run alone.
    fn many<'c>(
        &'c self,
        connection: &'c mut PgConnection,
        orders: &'c [Self::Order],
    ) -> impl Future<Output = Result<Vec<Option<PgRow>>, sqlx::Error>> + Send + 'c;
}

/// The executors' bounds.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Executors, each holding one connection of the pool.
    pub connections: u32,
    /// Most orders sent in one call.
    pub batch_max: usize,
    /// A held connection unused this long is checked before use.
    pub idle_check_after: Duration,
    /// Most orders waiting for an executor.
    pub queue_max: usize,
}

/// Why an order got no row.
#[derive(Debug)]
pub struct Failure {
    pub error: sqlx::Error,
    /// The call carrying the order was sent, and its answer was lost: the
    /// order may have been carried out.
    pub may_have_committed: bool,
}

struct Job<Order> {
    order: Order,
    reply: oneshot::Sender<Result<PgRow, Failure>>,
}

/// Where orders wait for an executor. Cloned into every request.
pub struct Queue<Order> {
    jobs: mpsc::Sender<Job<Order>>,
}

impl<Order> Clone for Queue<Order> {
    fn clone(&self) -> Self {
        Self {
            jobs: self.jobs.clone(),
        }
    }
}

impl<Order: Send + Sync + 'static> Queue<Order> {
    /// Starts `bounds.connections` executors on `db` for `call`, each
    /// call's number of orders observed in `sizes`. They stop when the
    /// last `Queue` is dropped, or when their handles are aborted.
    pub fn start<Call>(
        db: PgPool,
        call: Call,
        bounds: Bounds,
        sizes: prometheus::Histogram,
    ) -> (Self, Vec<tokio::task::JoinHandle<()>>)
    where
        Call: BatchedCall<Order = Order>,
    {
        let (jobs, waiting) = mpsc::channel(bounds.queue_max.max(1));
        let shared = Arc::new(Shared {
            db,
            call,
            waiting: Mutex::new(waiting),
            batch_max: bounds.batch_max.max(1),
            idle_check_after: bounds.idle_check_after,
            sizes,
        });
        let executors = (0..bounds.connections.max(1))
            .map(|_| {
                tokio::spawn(
                    Executor {
                        shared: shared.clone(),
                        held: None,
                    }
                    .run(),
                )
            })
            .collect();
        (Self { jobs }, executors)
    }

    /// Runs one order and waits for its row.
    pub async fn run(&self, order: Order) -> Result<PgRow, Failure> {
        let (reply, answer) = oneshot::channel();
        if self.jobs.send(Job { order, reply }).await.is_err() {
            return Err(Failure {
                error: sqlx::Error::PoolClosed,
                may_have_committed: false,
            });
        }
        // An executor that stops without answering (a panic, an abort at
        // shutdown) may have sent the order already.
        answer.await.unwrap_or_else(|_| {
            Err(Failure {
                error: sqlx::Error::WorkerCrashed,
                may_have_committed: true,
            })
        })
    }
}

struct Shared<Call: BatchedCall> {
    db: PgPool,
    call: Call,
    /// Taken by one executor at a time, which waits for the next order and
    /// then takes every one already waiting.
    waiting: Mutex<mpsc::Receiver<Job<Call::Order>>>,
    batch_max: usize,
    idle_check_after: Duration,
    sizes: prometheus::Histogram,
}

/// A connection kept between calls, and when it was last used.
struct Held {
    connection: PoolConnection<Postgres>,
    last_used: Instant,
}

struct Executor<Call: BatchedCall> {
    shared: Arc<Shared<Call>>,
    held: Option<Held>,
}

impl<Call: BatchedCall> Executor<Call> {
    async fn run(mut self) {
        while let Some(batch) = self.next_batch().await {
            let (orders, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|job| (job.order, job.reply)).unzip();
            self.shared.sizes.observe(orders.len() as f64);
            if orders.len() == 1 {
                let (order, reply) = orders.into_iter().zip(replies).next().expect("one order");
                self.alone(order, reply).await;
            } else {
                self.together(orders, replies).await;
            }
        }
    }

    /// The next order, and every one waiting behind it, up to `batch_max`;
    /// `None` once every queue is gone.
    async fn next_batch(&self) -> Option<Vec<Job<Call::Order>>> {
        let mut waiting = self.shared.waiting.lock().await;
        let first = waiting.recv().await?;
        let mut batch = vec![first];
        while batch.len() < self.shared.batch_max {
            match waiting.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        Some(batch)
    }

    async fn alone(&mut self, order: Call::Order, reply: oneshot::Sender<Result<PgRow, Failure>>) {
        let Executor { shared, held } = self;
        let answer = match connection(held, shared).await {
            Ok(connection) => shared.call.one(connection, &order).await,
            Err(error) => {
                let _ = reply.send(Err(Failure {
                    error,
                    may_have_committed: false,
                }));
                return;
            }
        };
        self.used(answer.as_ref().err());
        let _ = reply.send(answer.map_err(|error| Failure {
            error,
            may_have_committed: true,
        }));
    }

    async fn together(
        &mut self,
        orders: Vec<Call::Order>,
        replies: Vec<oneshot::Sender<Result<PgRow, Failure>>>,
    ) {
        let Executor { shared, held } = self;
        let answer = match connection(held, shared).await {
            Ok(connection) => shared.call.many(connection, &orders).await,
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(Failure {
                        error: copy_of(&error),
                        may_have_committed: false,
                    }));
                }
                return;
            }
        };
        self.used(answer.as_ref().err());
        match answer {
            Ok(rows) if rows.len() == orders.len() => {
                for ((order, reply), row) in orders.into_iter().zip(replies).zip(rows) {
                    match row {
                        Some(row) => {
                            let _ = reply.send(Ok(row));
                        }
                        None => self.alone(order, reply).await,
                    }
                }
            }
            // PostgreSQL refused the call as a whole and rolled it back:
            // nothing of any order was written, and each gets its own
            // answer alone. A batch answered with the wrong number of rows
            // is a bug on one side, and runs the same way.
            Ok(_) | Err(sqlx::Error::Database(_)) => {
                for (order, reply) in orders.into_iter().zip(replies) {
                    self.alone(order, reply).await;
                }
            }
            Err(error) => {
                for reply in replies {
                    let _ = reply.send(Err(Failure {
                        error: copy_of(&error),
                        may_have_committed: true,
                    }));
                }
            }
        }
    }

    /// After a call: the connection is kept unless the error may have left
    /// it broken, or on a server the pool should leave.
    fn used(&mut self, error: Option<&sqlx::Error>) {
        match error {
            Some(error) if !leaves_the_connection_usable(error) => self.forget_the_connection(),
            _ => {
                if let Some(held) = &mut self.held {
                    held.last_used = Instant::now();
                }
            }
        }
    }

    fn forget_the_connection(&mut self) {
        forget(&mut self.held);
    }
}

/// The held connection, checked first when it was idle for
/// `idle_check_after`; or a new one from the pool (checked there).
async fn connection<'a, Call: BatchedCall>(
    held: &'a mut Option<Held>,
    shared: &Shared<Call>,
) -> Result<&'a mut PgConnection, sqlx::Error> {
    if let Some(kept) = held {
        if kept.last_used.elapsed() >= shared.idle_check_after && kept.connection.ping().await.is_err() {
            tracing::info!("a held database connection broke while idle; replacing it");
            forget(held);
        }
    }
    let kept = match held {
        Some(kept) => kept,
        None => held.insert(Held {
            connection: shared.db.acquire().await?,
            last_used: Instant::now(),
        }),
    };
    Ok(&mut *kept.connection)
}

/// Drops a held connection, closing it rather than giving it back.
fn forget(held: &mut Option<Held>) {
    if let Some(mut kept) = held.take() {
        kept.connection.close_on_drop();
    }
}

/// An error PostgreSQL answered with, other than those that end or
/// question the session: connection exceptions (class 08), operator
/// intervention such as a shutdown (57), and a read-only server after a
/// failover (25006), whose next connection should come through the pool.
fn leaves_the_connection_usable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database) => {
            let code = database.code().unwrap_or_default();
            !(code.starts_with("08") || code.starts_with("57") || code == "25006")
        }
        _ => false,
    }
}

/// One error told to every order of a batch: `sqlx::Error` is not `Clone`.
/// Only errors that are not PostgreSQL's own reach here, and each is said
/// as the broken connection it is.
fn copy_of(error: &sqlx::Error) -> sqlx::Error {
    let kind = match error {
        sqlx::Error::Io(io) => io.kind(),
        _ => std::io::ErrorKind::ConnectionAborted,
    };
    match error {
        sqlx::Error::PoolTimedOut => sqlx::Error::PoolTimedOut,
        sqlx::Error::PoolClosed => sqlx::Error::PoolClosed,
        error => sqlx::Error::Io(std::io::Error::new(kind, error.to_string())),
    }
}
