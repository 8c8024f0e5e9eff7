//! The live feed page: every decision on the visitor's transfers as it is
//! made, and what is missing from the feed, and why.

use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, web};
use askama::Template;
use askama_web::WebTemplate;

use crate::feed::{DropReason, Gaps, Source};
use crate::state::AppState;
use crate::web::money;

use super::*;

#[derive(Template, WebTemplate)]
#[template(path = "feed.html")]
struct FeedPage {
    chrome: Chrome,
    /// The visitor's lab wallets, comma-separated: a transfer to one of
    /// them moved lab money (the row guard allows lab transfers only
    /// between a visitor's own two). Lab entries say so themselves when
    /// the run sent switches; a deployment that keeps every layer on sends
    /// none, and its lab entries share the real stream.
    lab_wallets: String,
    /// The wallets the page can name, as a JSON object from wallet id to
    /// words: the visitor's own (their wallet, lab wallets A and B) and the
    /// owners of the wallets they sent to lately. A wallet not in it is
    /// told by its id's short form.
    wallet_names: String,
    /// The deployment's currency, for every other transfer.
    currency: String,
    /// What is missing from the feed, and why, in sentences.
    gaps: Vec<String>,
}

pub async fn feed(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let session = match require_session(&request, &state).await {
        Ok(session) => session,
        Err(response) => return response,
    };
    let wallets = match wallets_named(&state.db, session.token.user_id.0, session.wallet_id).await {
        Ok(wallets) => wallets,
        Err(error) => return unavailable(&state, Some(&session), &error),
    };
    with_page(
        StatusCode::OK,
        FeedPage {
            chrome: Chrome::new(&state, "Live feed", Some(&session)),
            lab_wallets: wallets
                .iter()
                .filter(|wallet| wallet.lab_slot.is_some())
                .map(|wallet| wallet.id.to_string())
                .collect::<Vec<_>>()
                .join(","),
            wallet_names: names_as_json(&wallets),
            currency: session.currency.clone(),
            gaps: gaps_in_words(&state.feed.gaps(session.token.user_id).await, &state.config.feed),
        },
    )
}

/// How many of the visitor's latest transfers name their recipients on
/// the page: enough for the wallets a person sends to, bounded so that
/// the page stays one index scan however long the history.
const RECIPIENTS_FROM_TRANSFERS_MAX: i64 = 200;

/// A wallet the page names: one of the visitor's own (`lab_slot` says
/// which lab wallet), or a recent recipient, by its owner's name.
#[derive(sqlx::FromRow)]
struct NamedWallet {
    id: uuid::Uuid,
    lab_slot: Option<i16>,
    owner: Option<String>,
}

/// The visitor's own wallets and the recipients of their latest transfers
/// from `wallet`.
async fn wallets_named(
    db: &sqlx::PgPool,
    user: uuid::Uuid,
    wallet: uuid::Uuid,
) -> Result<Vec<NamedWallet>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, lab_slot, NULL::text AS owner FROM wallets WHERE user_id = $1
         UNION ALL
         SELECT w.id, NULL, min(u.name)
           FROM (SELECT to_wallet_id FROM transfers WHERE from_wallet_id = $2
                  ORDER BY created_at DESC, id DESC LIMIT $3) t
           JOIN wallets w ON w.id = t.to_wallet_id AND w.user_id <> $1
           JOIN users u ON u.id = w.user_id
          GROUP BY w.id",
    )
    .bind(user)
    .bind(wallet)
    .bind(RECIPIENTS_FROM_TRANSFERS_MAX)
    .fetch_all(db)
    .await
}

/// Each named wallet in the words a visitor knows it by, as the JSON
/// object the page's script reads.
fn names_as_json(wallets: &[NamedWallet]) -> String {
    let names: std::collections::BTreeMap<String, String> = wallets
        .iter()
        .map(|wallet| {
            let name = match (wallet.lab_slot, &wallet.owner) {
                (Some(1), _) => "lab wallet A".to_owned(),
                (Some(2), _) => "lab wallet B".to_owned(),
                (Some(_), _) => "your lab payouts' holds".to_owned(),
                (None, Some(owner)) => owner.clone(),
                (None, None) => "your wallet".to_owned(),
            };
            (wallet.id.to_string(), name)
        })
        .collect();
    serde_json::to_string(&names).unwrap_or_else(|_| "{}".to_owned())
}

/// The feed's gaps as the page tells them to a visitor.
fn gaps_in_words(gaps: &Gaps, feed: &crate::settings::Feed) -> Vec<String> {
    let time = |at: &chrono::DateTime<chrono::Utc>| at.format("%H:%M:%S UTC on %Y-%m-%d").to_string();
    let removed = gaps.removed.iter().map(|(source, at)| {
        let which = match source {
            Source::Real => "your real transfers",
            Source::Lab => "your race-lab runs",
        };
        format!(
            "The decisions on {which} before {} were removed. The feed keeps at most {} entries across everyone's \
             streams, and when it is full it removes the streams written to least recently. Decisions since then \
             appear as usual, and your money was not affected.",
            time(at),
            money::group_thousands(feed.entries_max),
        )
    });
    let dropped = gaps.dropped.iter().map(|drops| {
        let why = match drops.reason {
            DropReason::QueueFull => format!(
                "decisions came faster than it could write them (it holds up to {} waiting)",
                money::group_thousands(feed.queue_entries_max as u64)
            ),
            DropReason::RedisFailed => "Redis, where the feed is kept, failed or did not answer in time".to_owned(),
        };
        let entries = match drops.entries {
            1 => "1 decision".to_owned(),
            n => format!("{} decisions", money::group_thousands(n)),
        };
        format!(
            "This server left {entries} out of the feed between {} and {}, because {why}. Yours may be among them; \
             the transfers themselves were made or refused as their answers said.",
            time(&drops.first),
            time(&drops.last),
        )
    });
    removed.chain(dropped).collect()
}
