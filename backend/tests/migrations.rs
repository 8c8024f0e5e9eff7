//! The schema as migrations/ defines it: each SQL function in one place,
//! and a database made by an earlier build refused with a way out.

use std::collections::BTreeMap;

use layered_wallet::database::{MIGRATOR, migrate};
use sqlx::PgPool;
use wallet_testkit::*;

fn migration_files() -> Vec<(String, String)> {
    let folder = concat!(env!("CARGO_MANIFEST_DIR"), "/../migrations");
    let mut files: Vec<(String, String)> = std::fs::read_dir(folder)
        .expect("migrations/ must exist")
        .map(|entry| entry.expect("a readable entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .map(|path| {
            let name = path
                .file_name()
                .expect("a file name")
                .to_string_lossy()
                .into_owned();
            let text = std::fs::read_to_string(&path).expect("a readable migration");
            (name, text)
        })
        .collect();
    files.sort();
    files
}

/// A reader finds each function's one live definition in one file: no
/// restatement, no `CREATE OR REPLACE` over an earlier file's version.
#[test]
fn each_sql_function_is_defined_once() {
    let definition = regex::Regex::new(r"(?i)\bCREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+([a-z_][a-z0-9_]*)")
        .expect("regex");
    let mut defined_in: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (file, text) in migration_files() {
        // Comments may name a function; only code defines one.
        let code: String = text
            .lines()
            .map(|line| line.split("--").next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        for found in definition.captures_iter(&code) {
            defined_in
                .entry(found[1].to_lowercase())
                .or_default()
                .push(file.clone());
        }
    }
    assert!(
        defined_in.contains_key("transfer"),
        "the scan must find the functions it checks: {defined_in:?}"
    );
    let repeated: Vec<_> = defined_in.iter().filter(|(_, files)| files.len() > 1).collect();
    assert!(
        repeated.is_empty(),
        "functions defined more than once (edit the one definition instead): {repeated:?}"
    );
}

/// A database of its own with the baseline applied.
async fn migrated_database() -> (String, PgPool) {
    let (name, options) = create_database().await;
    let db = PgPool::connect_with(options).await.expect("connect");
    MIGRATOR
        .run(&db)
        .await
        .expect("the baseline applies to an empty database");
    (name, db)
}

/// A database whose recorded migrations are not in the baseline is refused
/// before anything is applied, with a message that says what to do.
#[tokio::test]
async fn a_database_made_by_an_earlier_build_is_refused_with_what_to_do() {
    let (name, db) = migrated_database().await;
    // What an earlier build recorded: a migration the baseline no longer has.
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time)
         VALUES (20261130000001, 'wallets', true, '\\x00', 1)",
    )
    .execute(&db)
    .await
    .expect("record an old migration");
    let tables_before: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&db)
        .await
        .expect("count tables");

    let error = migrate(&db)
        .await
        .expect_err("an earlier build's database must be refused");
    let message = error.to_string();
    assert!(message.contains("earlier build"), "{message}");
    assert!(message.contains("20261130000001"), "{message}");
    assert!(message.contains("./scripts/serve"), "{message}");

    let tables_after: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")
        .fetch_one(&db)
        .await
        .expect("count tables");
    assert_eq!(tables_after, tables_before, "nothing may be applied");
    db.close().await;
    drop_database(&name).await;
}

/// A database whose recorded migration of a number differs from the
/// baseline's (an earlier build's baseline) is refused the same way.
#[tokio::test]
async fn a_database_with_an_earlier_baseline_is_refused_with_what_to_do() {
    let (name, db) = migrated_database().await;
    sqlx::query("UPDATE _sqlx_migrations SET checksum = '\\x00' WHERE version = 20261202000003")
        .execute(&db)
        .await
        .expect("record an earlier baseline");
    let message = migrate(&db).await.expect_err("must be refused").to_string();
    assert!(message.contains("earlier build"), "{message}");
    assert!(message.contains("20261202000003"), "{message}");
    db.close().await;
    drop_database(&name).await;
}

/// Every statement that changes a balance bumps the wallet's version, in
/// the migrations and in the server's own SQL: the optimistic alternative to
/// the row guard compares versions, and a writer that skipped the bump
/// would let it overwrite a change it never saw.
#[test]
fn every_balance_change_bumps_the_version() {
    let update = regex::Regex::new(r"(?is)\bUPDATE\s+wallets\s+SET\b(.*?)(\bWHERE\b|;|$)").expect("regex");
    let mut sources = migration_files();
    let backend = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
    let mut folders = vec![std::path::PathBuf::from(backend)];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("a readable folder") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let text = std::fs::read_to_string(&path).expect("a readable source");
                sources.push((path.display().to_string(), text));
            }
        }
    }
    let mut checked = 0;
    for (file, text) in sources {
        let code: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with("--") && !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for statement in update.captures_iter(&code) {
            let assignments = &statement[1];
            if assignments.contains("balance_minor") && !assignments.contains("opening_balance_minor =") {
                checked += 1;
            }
            if assignments.contains("balance_minor") {
                assert!(
                    assignments.contains("version = version + 1"),
                    "{file}: a balance change without its version bump: UPDATE wallets SET{assignments}"
                );
            }
        }
    }
    assert!(
        checked >= 11,
        "only {checked} balance changes found: is the pattern still right?"
    );
}
