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
    let lab_wallets: Vec<uuid::Uuid> =
        match sqlx::query_scalar("SELECT id FROM wallets WHERE user_id = $1 AND lab_slot IS NOT NULL")
            .bind(session.token.user_id.0)
            .fetch_all(&state.db)
            .await
        {
            Ok(wallets) => wallets,
            Err(error) => return unavailable(&state, Some(&session), &error),
        };
    with_page(
        StatusCode::OK,
        FeedPage {
            chrome: Chrome::new(&state, "Live feed", Some(&session)),
            lab_wallets: lab_wallets
                .iter()
                .map(uuid::Uuid::to_string)
                .collect::<Vec<_>>()
                .join(","),
            currency: session.currency.clone(),
            gaps: gaps_in_words(&state.feed.gaps(session.token.user_id).await, &state.config.feed),
        },
    )
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
