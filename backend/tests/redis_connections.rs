//! The process's Redis store gives each thread that uses it one connection
//! of its own, made on first use, and never another store's: a thread's
//! connections are found by their store's address, and stores come and go
//! (each test's app makes its own).

use layered_wallet::redis_store::RedisStore;
use secrecy::SecretString;
use wallet_testkit::*;

/// Stores made and dropped one after another on one thread, on two
/// databases in turn.
const STORES_IN_TURN: u8 = 16;

/// A store on Redis database `database` of the test server.
fn store_on(database: u8) -> RedisStore {
    let mut url = reqwest::Url::parse(&redis_url()).expect("REDIS_URL must be a Redis URL");
    url.set_path(&format!("/{database}"));
    let mut settings = test_settings("postgres://unused@127.0.0.1/unused", "test:connections:");
    settings.redis_url = SecretString::from(url.to_string());
    let config = settings.validate().expect("valid settings");
    RedisStore::connect(&config.redis).expect("a store")
}

/// The id Redis gives the connection a store hands this thread, and the
/// database that connection uses.
async fn connection_of(store: &RedisStore) -> (i64, u8) {
    let mut connection = store.get().await.expect("a connection");
    let id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut connection)
        .await
        .expect("CLIENT ID");
    let info: String = redis::cmd("CLIENT")
        .arg("INFO")
        .query_async(&mut connection)
        .await
        .expect("CLIENT INFO");
    let database = info
        .split_whitespace()
        .find_map(|field| field.strip_prefix("db="))
        .and_then(|database| database.parse().ok())
        .unwrap_or_else(|| panic!("CLIENT INFO names no database: {info}"));
    (id, database)
}

#[tokio::test]
async fn each_thread_keeps_one_connection_of_its_own() {
    assert_redis_reachable().await;
    let store = store_on(1);
    let (first, _) = connection_of(&store).await;
    let (again, _) = connection_of(&store.clone()).await;
    assert_eq!(first, again, "one thread, one connection, whichever clone asks");

    let elsewhere = store.clone();
    let other_thread = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let (first, _) = connection_of(&elsewhere).await;
            let (again, _) = connection_of(&elsewhere).await;
            (first, again)
        })
    })
    .join()
    .expect("the other thread");
    assert_eq!(
        other_thread.0, other_thread.1,
        "the other thread keeps its own too"
    );
    assert_ne!(other_thread.0, first, "each thread has a connection of its own");
}

#[tokio::test]
async fn a_store_made_after_another_was_dropped_never_gets_the_dropped_ones_connection() {
    assert_redis_reachable().await;
    for turn in 0..STORES_IN_TURN {
        let database = 1 + turn % 2;
        let store = store_on(database);
        let (_, connected_to) = connection_of(&store).await;
        assert_eq!(
            connected_to, database,
            "store {turn} was handed a connection to another database"
        );
        drop(store);
    }
}
