//! `GET /api/v1/wallets/{id}`: a wallet's balances, for its owner only.

use actix_web::{HttpRequest, HttpResponse, web};
use serde::Serialize;
use uuid::Uuid;

use crate::problem::{self, Problem};
use crate::routes::authenticate;
use crate::state::AppState;

#[derive(Serialize, utoipa::ToSchema)]
pub struct Wallet {
    pub id: Uuid,
    /// The available balance: what the wallet can spend.
    pub balance_minor: i64,
    /// Set aside for payouts on their way to the bank.
    pub held_minor: i64,
    /// The available balance plus what is held.
    pub posted_balance_minor: i64,
    pub currency: String,
}

/// A wallet you own. Anyone else's, or one that does not exist, is a 404:
/// the answer does not reveal which wallets exist.
#[utoipa::path(
    get, path = "/api/v1/wallets/{id}", tag = "wallets",
    params(("id" = Uuid, Path, description = "Wallet id")),
    responses(
        (status = 200, body = Wallet),
    ),
    security(("bearer" = []))
)]
pub async fn get_wallet(
    request: HttpRequest,
    path: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let caller = authenticate(&request, &state).await?;
    let not_found = || Problem::not_found("You have no wallet with this id.");
    let id = crate::domain::parse_uuid(&path.into_inner()).ok_or_else(not_found)?;
    let wallet = sqlx::query_as::<_, (i64, String, i64)>(
        "SELECT balance_minor, currency, payouts_held_minor(id) FROM wallets WHERE id = $1 AND user_id = $2",
    )
    .bind(id)
    .bind(caller.user_id.0)
    .fetch_optional(&state.db)
    .await
    .map_err(|error| problem::from_database_error(&error, "reading a wallet"))?
    .ok_or_else(not_found)?;
    let (balance_minor, currency, held_minor) = wallet;
    Ok(HttpResponse::Ok().json(Wallet {
        id,
        balance_minor,
        held_minor,
        posted_balance_minor: balance_minor + held_minor,
        currency,
    }))
}
