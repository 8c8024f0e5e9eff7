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
//! Why on the HTTP workers' threads: each worker starts its own share of
//! `connections` (`start_on_this_thread`), and a request hands its order
//! to those of its own thread, whose event loop is awake anyway. On
//! another runtime, every call woke a sleeping thread twice (the order
//! handed over, the answers handed back): the largest share of a
//! transfer's CPU. A thread without executors (none in the server) runs
//! its order alone on a connection from the pool.
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

use std::any::Any;
use std::cell::RefCell;
use std::future::Future;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
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
    /// Executors of the instance, one connection each, among `threads`.
    pub connections: u32,
    /// The threads that start executors of their own: the HTTP workers.
    pub threads: u32,
    /// Most orders sent in one call.
    pub batch_max: usize,
    /// A held connection unused this long is checked before use.
    pub idle_check_after: Duration,
    /// Most orders waiting for one thread's executors.
    pub queue_max: usize,
}

impl Bounds {
    /// The `nth` thread's executors: an equal share of `connections`, and
    /// one more for each of the first threads until all are shared out.
    fn executors_of_thread(&self, nth: u32) -> u32 {
        let threads = self.threads.max(1);
        let share = self.connections / threads;
        let left_over = self.connections % threads;
        (share + u32::from(nth % threads < left_over)).max(1)
    }
}

/// Why an order got no row.
#[derive(Debug)]
pub struct Failure {
    pub error: sqlx::Error,
    /// The order's call was sent and its answer lost: it may have been made.
    pub may_have_committed: bool,
}

struct Job<Order> {
    order: Order,
    reply: oneshot::Sender<Result<PgRow, Failure>>,
}

/// One path's executors: what each thread starts its own from, and the
/// way to those of the thread an order is on.
pub struct Executors<Call: BatchedCall> {
    plan: Arc<Plan<Call>>,
}

impl<Call: BatchedCall> Clone for Executors<Call> {
    fn clone(&self) -> Self {
        Self {
            plan: self.plan.clone(),
        }
    }
}

struct Plan<Call: BatchedCall> {
    /// Tells this path's executors from another's on the same thread.
    id: u64,
    /// The runtime the executors were made on, where a connection goes
    /// back to the pool when its executor outlives its own thread's
    /// runtime (`Executor`'s `Drop`).
    home: tokio::runtime::Handle,
    db: PgPool,
    call: Call,
    bounds: Bounds,
    sizes: prometheus::Histogram,
    /// Threads that started executors so far.
    threads_started: AtomicU32,
}

static NEXT_PLAN_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's executors' queues, by path (`Plan::id`).
    static QUEUES_OF_THIS_THREAD: RefCell<Vec<(u64, Box<dyn Any>)>> = const { RefCell::new(Vec::new()) };
}

impl<Call: BatchedCall> Executors<Call> {
    /// The executors of `call` on `db`, each call's number of orders
    /// observed in `sizes`. None runs until a thread starts its own. Made
    /// on a runtime.
    pub fn new(db: PgPool, call: Call, bounds: Bounds, sizes: prometheus::Histogram) -> Self {
        Self {
            plan: Arc::new(Plan {
                id: NEXT_PLAN_ID.fetch_add(1, Ordering::Relaxed),
                home: tokio::runtime::Handle::current(),
                db,
                call,
                bounds,
                sizes,
                threads_started: AtomicU32::new(0),
            }),
        }
    }

    /// Starts this thread's executors, once however often it is asked
    /// (an HTTP worker builds its application once per listener). Must run
    /// on a thread whose runtime takes local tasks, as an HTTP worker's
    /// does; they stop with it.
    pub fn start_on_this_thread(&self) {
        if self.queue_of_this_thread().is_some() {
            return;
        }
        let nth = self.plan.threads_started.fetch_add(1, Ordering::Relaxed);
        let (jobs, waiting) = mpsc::channel::<Job<Call::Order>>(self.plan.bounds.queue_max.max(1));
        let shared = Rc::new(Shared {
            plan: self.plan.clone(),
            waiting: Mutex::new(waiting),
        });
        for _ in 0..self.plan.bounds.executors_of_thread(nth) {
            tokio::task::spawn_local(
                Executor {
                    shared: shared.clone(),
                    held: None,
                }
                .run(),
            );
        }
        QUEUES_OF_THIS_THREAD.with_borrow_mut(|queues| queues.push((self.plan.id, Box::new(jobs))));
    }

    fn queue_of_this_thread(&self) -> Option<mpsc::Sender<Job<Call::Order>>> {
        QUEUES_OF_THIS_THREAD.with_borrow(|queues| {
            queues
                .iter()
                .find(|(id, _)| *id == self.plan.id)
                .and_then(|(_, jobs)| jobs.downcast_ref::<mpsc::Sender<Job<Call::Order>>>())
                .cloned()
        })
    }

    /// Runs one order and waits for its row: on this thread's executors,
    /// or alone on a connection from the pool on a thread without them.
    pub async fn run(&self, order: Call::Order) -> Result<PgRow, Failure> {
        let Some(jobs) = self.queue_of_this_thread() else {
            // Boxed: kilobytes of future every transfer would carry and copy.
            return Box::pin(self.alone_on_a_pooled_connection(order)).await;
        };
        let (reply, answer) = oneshot::channel();
        if jobs.send(Job { order, reply }).await.is_err() {
            return Err(Failure {
                error: sqlx::Error::PoolClosed,
                may_have_committed: false,
            });
        }
        // An executor that stops without answering (a panic, its worker
        // stopping) may have sent the order already.
        answer.await.unwrap_or_else(|_| {
            Err(Failure {
                error: sqlx::Error::WorkerCrashed,
                may_have_committed: true,
            })
        })
    }

    async fn alone_on_a_pooled_connection(&self, order: Call::Order) -> Result<PgRow, Failure> {
        let mut connection = self.plan.db.acquire().await.map_err(|error| Failure {
            error,
            may_have_committed: false,
        })?;
        self.plan
            .call
            .one(&mut connection, &order)
            .await
            .map_err(|error| Failure {
                error,
                may_have_committed: true,
            })
    }
}

/// What one thread's executors share.
struct Shared<Call: BatchedCall> {
    plan: Arc<Plan<Call>>,
    /// Taken by one executor at a time, which waits for the next order and
    /// then takes every one already waiting.
    waiting: Mutex<mpsc::Receiver<Job<Call::Order>>>,
}

/// A connection kept between calls, and when it was last used.
struct Held {
    connection: PoolConnection<Postgres>,
    last_used: Instant,
}

struct Executor<Call: BatchedCall> {
    shared: Rc<Shared<Call>>,
    held: Option<Held>,
}

/// A stopping HTTP worker drops its runtime before its local tasks, and
/// sqlx gives a dropped connection back from a task it spawns: with no
/// runtime left here, that happens on the one the executors were made on.
impl<Call: BatchedCall> Drop for Executor<Call> {
    fn drop(&mut self) {
        let _on_a_runtime = tokio::runtime::Handle::try_current()
            .is_err()
            .then(|| self.shared.plan.home.enter());
        self.held = None;
    }
}

impl<Call: BatchedCall> Executor<Call> {
    async fn run(mut self) {
        while let Some(batch) = self.next_batch().await {
            let (orders, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|job| (job.order, job.reply)).unzip();
            self.shared.plan.sizes.observe(orders.len() as f64);
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
        while batch.len() < self.shared.plan.bounds.batch_max.max(1) {
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
            Ok(connection) => shared.plan.call.one(connection, &order).await,
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
            Ok(connection) => shared.plan.call.many(connection, &orders).await,
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
        if kept.last_used.elapsed() >= shared.plan.bounds.idle_check_after
            && kept.connection.ping().await.is_err()
        {
            tracing::info!("a held database connection broke while idle; replacing it");
            forget(held);
        }
    }
    let kept = match held {
        Some(kept) => kept,
        None => held.insert(Held {
            connection: shared.plan.db.acquire().await?,
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
