//! Sign-up and sign-in: `POST /api/v1/users`, `POST /api/v1/tokens`,
//! `DELETE /api/v1/tokens/current`.

use actix_web::{HttpRequest, HttpResponse, web};
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use sqlx::AssertSqlSafe;
use uuid::Uuid;

use crate::auth;
use crate::domain::{UserId, WalletId};
use crate::names::{self, ComparableName, MATCHES_NAME};
use crate::problem::{self, Problem, ProblemType};
use crate::routes::{authenticate, read_json_body};
use crate::settings::Config;
use crate::state::AppState;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    /// Letters, digits, the marks that go on them and `' - . : _ ·` (the
    /// characters Unicode allows in identifiers, UTS #39, read after NFKC),
    /// with single plain spaces between words. Latin may not mix with
    /// Cyrillic or Greek, nor a name with more than two scripts, and a name
    /// that looks like an existing one is refused (409). The pattern states
    /// the names every deployment accepts: ASCII letters, digits and
    /// `' . _ : -`. Beyond them, `x-accepted-pattern` says what every
    /// accepted name keeps (no blank at either end, no two blanks together,
    /// no blank but a plain space), and the rules above decide the rest.
    pub name: String,
    /// `password_chars_min` to `password_chars_max` characters (8 to 128
    /// unless the deployment says otherwise; the schema states its own).
    #[schema(value_type = String, format = Password)]
    pub password: SecretString,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct SignedUp {
    pub user_id: Uuid,
    pub wallet_id: Uuid,
    /// Shown once; send it as `Authorization: Bearer <token>`.
    pub token: String,
    pub balance_minor: i64,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct IssuedTokenBody {
    pub token: String,
    pub expires_at: chrono::DateTime<chrono::Utc>,
}

impl Credentials {
    fn parse(body: &[u8], config: &Config) -> Result<(Self, ComparableName), Problem> {
        let mut fields = problem::Fields::of(body, &["name", "password"])?;
        let name = fields.string("name");
        let password = fields.string("password");
        fields.finish("Send {\"name\": …, \"password\": …}")?;
        let credentials = Credentials {
            name: name.unwrap_or_default(),
            password: SecretString::from(password.unwrap_or_default()),
        };
        let name = credentials.validate(config)?;
        Ok((credentials, name))
    }

    /// The account rules, for the API and the browser form alike: the
    /// name's (`names`) and the password's length.
    pub fn validate(&self, config: &Config) -> Result<ComparableName, Problem> {
        let name = ComparableName::parse(&self.name, config.accounts.user_name_chars_max)
            .map_err(|problem| problem.at_field("name"))?;
        use secrecy::ExposeSecret;
        let password_chars = self.password.expose_secret().chars().count();
        if password_chars < config.accounts.password_chars_min
            || password_chars > config.accounts.password_chars_max
        {
            return Err(Problem::validation(format!(
                "A password has {} to {} characters.",
                config.accounts.password_chars_min, config.accounts.password_chars_max
            ))
            .detail_is_for_people()
            .at_field("password"));
        }
        Ok(name)
    }
}

/// Create a user with a wallet holding the signup grant, and a first token.
#[utoipa::path(
    post, path = "/api/v1/users", tag = "users",
    request_body = Credentials,
    responses(
        (status = 201, description = "Signed up", body = SignedUp),
    )
)]
pub async fn sign_up(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let body = read_json_body(&request, payload, &state.config).await?;
    let (credentials, name) = Credentials::parse(&body, &state.config)?;
    state.account_limits.check_sign_up(&request, &name.key).await?;
    let signed_up = create_user(&state, &name, credentials.password).await?;
    Ok(HttpResponse::Created().json(signed_up))
}

/// Creates the user, the wallet and the first token in one transaction.
/// Shared by the API and the browser sign-up form.
pub async fn create_user(
    state: &AppState,
    name: &ComparableName,
    password: SecretString,
) -> Result<SignedUp, Problem> {
    let password_hash = state
        .passwords
        .hash(password)
        .await
        .map_err(|_| busy())?
        .map_err(|error| {
            tracing::error!(error = %error, "password hashing failed");
            Problem::internal()
        })?;
    let user_id = UserId(Uuid::now_v7());
    let wallet_id = WalletId(Uuid::now_v7());
    let grant = state.config.money.signup_grant_minor;
    let issued = state.tokens.issue(user_id, state.config.accounts.api_token_ttl);

    let result: Result<(), sqlx::Error> = async {
        let mut tx = state.db.begin().await?;
        insert_account(&mut tx, user_id, name, &password_hash).await?;
        insert_wallet(&mut tx, wallet_id, user_id, &state.config.money.currency, grant).await?;
        auth::store_token(&mut *tx, user_id, &issued).await?;
        tx.commit().await
    }
    .await;
    match result {
        Ok(()) => {}
        Err(sqlx::Error::Database(db)) if db.is_unique_violation() => {
            let detail = if db.constraint() == Some("users_name_skeleton_idx") {
                "This name reads like another user's name (letters that look alike); pick another."
            } else {
                "Another user already has this name (compared ignoring case and width); pick another."
            };
            return Err(Problem::new(ProblemType::NameTaken, detail).detail_is_for_people());
        }
        Err(error) => return Err(problem::from_database_error(&error, "signing up")),
    }
    use secrecy::ExposeSecret;
    Ok(SignedUp {
        user_id: user_id.0,
        wallet_id: wallet_id.0,
        token: issued.token.expose_secret().to_owned(),
        balance_minor: grant,
    })
}

/// Exchange a name and password for a new bearer token.
#[utoipa::path(
    post, path = "/api/v1/tokens", tag = "users",
    request_body = Credentials,
    responses(
        (status = 201, description = "Signed in", body = IssuedTokenBody),
    )
)]
pub async fn sign_in(
    request: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let body = read_json_body(&request, payload, &state.config).await?;
    let (credentials, _) = Credentials::parse(&body, &state.config)
        .map_err(|_| Problem::unauthorized("Wrong name or password.").detail_is_for_people())?;
    let issued = sign_in_within_limits(&state, &request, credentials).await?;
    use secrecy::ExposeSecret;
    Ok(HttpResponse::Created().json(IssuedTokenBody {
        token: issued.token.expose_secret().to_owned(),
        expires_at: issued.expires_at,
    }))
}

/// A sign-in under the account limits: refused before the password is
/// checked when one more failure would not be allowed; a wrong password is
/// counted, a right one remembers the address. Shared by the API and the
/// browser sign-in form.
pub async fn sign_in_within_limits(
    state: &AppState,
    request: &HttpRequest,
    credentials: Credentials,
) -> Result<auth::IssuedToken, Problem> {
    let limits = &state.account_limits;
    let attempt = limits
        .sign_in_may_try(request, &names::key_of(&credentials.name))
        .await?;
    let issued = issue_token_for(state, credentials).await;
    match &issued {
        Ok(_) => limits.sign_in_succeeded(&attempt).await,
        Err(problem) if problem.status_code() == actix_web::http::StatusCode::UNAUTHORIZED => {
            limits.sign_in_failed(&attempt).await
        }
        Err(_) => {}
    }
    issued
}

/// Checks the password and stores a new token.
pub async fn issue_token_for(
    state: &AppState,
    credentials: Credentials,
) -> Result<auth::IssuedToken, Problem> {
    let row = sqlx::query_as::<_, (Uuid, String)>(AssertSqlSafe(format!(
        "SELECT u.id, u.password_hash FROM users u WHERE {MATCHES_NAME} ORDER BY u.name = $1 DESC LIMIT 1"
    )))
    .bind(&credentials.name)
    .bind(names::key_of(&credentials.name))
    .fetch_optional(&state.db)
    .await
    .map_err(|error| problem::from_database_error(&error, "signing in"))?;
    let (user_id, stored_hash) = match row {
        Some((id, hash)) => (Some(UserId(id)), Some(hash)),
        None => (None, None),
    };
    let matches = state
        .passwords
        .verify(credentials.password, stored_hash)
        .await
        .map_err(|_| busy())?
        .map_err(|error| {
            tracing::error!(error = %error, "password verification failed");
            Problem::internal()
        })?;
    let (true, Some(user_id)) = (matches, user_id) else {
        return Err(Problem::unauthorized("Wrong name or password.").detail_is_for_people());
    };
    let issued = state.tokens.issue(user_id, state.config.accounts.api_token_ttl);
    auth::store_token(&state.db, user_id, &issued)
        .await
        .map_err(|error| problem::from_database_error(&error, "storing a token"))?;
    Ok(issued)
}

/// Revoke the token this request carries. Authenticated by the browser's
/// session cookie, the call must also carry the page's `X-CSRF-Token`, as
/// every state-changing call does.
#[utoipa::path(
    delete, path = "/api/v1/tokens/current", tag = "users",
    responses(
        (status = 204, description = "Revoked"),
    ),
    security(("bearer" = []))
)]
pub async fn revoke_current(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, Problem> {
    let token = authenticate(&request, &state).await?;
    state.tokens.require_csrf_header(&request, &token)?;
    revoke(&state, &token)
        .await
        .map_err(|error| problem::from_database_error(&error, "revoking a token"))?;
    Ok(HttpResponse::NoContent().finish())
}

/// Revokes a token: deletes its hash (the authority), then records the
/// revocation where the cooldown checks it, so the dead token cannot take
/// its owner's cooldown window. Shared by the API and the browser's sign-out.
pub async fn revoke(state: &AppState, token: &auth::VerifiedToken) -> Result<(), sqlx::Error> {
    auth::revoke_token(&state.db, token).await?;
    state.cooldown.note_revoked(token).await;
    Ok(())
}

/// Every password worker is busy: shed the sign-in rather than queue it.
/// A new account's row. A name taken (by key or by look-alike skeleton)
/// is a unique violation.
pub async fn insert_account(
    tx: &mut sqlx::PgConnection,
    user_id: UserId,
    name: &ComparableName,
    password_hash: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO users (id, name, name_key, name_skeleton, password_hash) VALUES ($1, $2, $3, $4, $5)",
    )
    .bind(user_id.0)
    .bind(&name.display)
    .bind(&name.key)
    .bind(&name.skeleton)
    .bind(password_hash)
    .execute(tx)
    .await
    .map(|_| ())
}

/// A real wallet holding `opening_minor` of `currency`.
pub async fn insert_wallet(
    tx: &mut sqlx::PgConnection,
    wallet_id: WalletId,
    user_id: UserId,
    currency: &str,
    opening_minor: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor) VALUES ($1, $2, $3, $4, $4)",
    )
    .bind(wallet_id.0)
    .bind(user_id.0)
    .bind(currency)
    .bind(opening_minor)
    .execute(tx)
    .await
    .map(|_| ())
}

fn busy() -> Problem {
    Problem::unavailable("Too many sign-ins at once. Retry in a moment.")
}
