//! The catalogue: every problem type this service answers with, its slug,
//! status and title for API clients, the sentence a person reads in the
//! browser, and the description `GET /problems/{slug}` shows.

use std::borrow::Cow;

use actix_web::http::StatusCode;

/// Every problem type this service answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProblemType {
    MalformedRequest,
    ValidationFailed,
    Unauthorized,
    CsrfTokenInvalid,
    NotYourWallet,
    NotFound,
    MethodNotAllowed,
    NameTaken,
    PayloadTooLarge,
    BodyTooSlow,
    UnsupportedMediaType,
    IdempotencyKeyReused,
    IdempotencyKeyInFlight,
    CooldownActive,
    TooManyAttempts,
    TooManyStreams,
    InsufficientFunds,
    VersionConflict,
    UnknownTargetWallet,
    CurrencyMismatch,
    SameWallet,
    RaceLabSwitchesOff,
    LabPassInvalid,
    LabWalletsOnly,
    ProviderSignatureInvalid,
    EventPayloadChanged,
    EventInFlight,
    DepositWalletUnknown,
    DepositCurrencyMismatch,
    DepositAmountOverLimit,
    DepositEventTooOld,
    DepositEventInFuture,
    PayoutsNotOffered,
    PayoutRefused,
    PayoutNeedsAttention,
    Overloaded,
    ServiceUnavailable,
    OutcomeUnknown,
    InternalError,
}

/// What the catalogue says about one problem type.
struct Entry {
    slug: &'static str,
    status: StatusCode,
    title: &'static str,
    /// What a person reads in the browser: no field names, no jargon.
    for_people: &'static str,
    /// What `GET /problems/{slug}` explains to API clients.
    description: &'static str,
}

impl ProblemType {
    pub const ALL: [ProblemType; 39] = [
        ProblemType::MalformedRequest,
        ProblemType::ValidationFailed,
        ProblemType::Unauthorized,
        ProblemType::CsrfTokenInvalid,
        ProblemType::NotYourWallet,
        ProblemType::NotFound,
        ProblemType::MethodNotAllowed,
        ProblemType::NameTaken,
        ProblemType::PayloadTooLarge,
        ProblemType::BodyTooSlow,
        ProblemType::UnsupportedMediaType,
        ProblemType::IdempotencyKeyReused,
        ProblemType::IdempotencyKeyInFlight,
        ProblemType::CooldownActive,
        ProblemType::TooManyAttempts,
        ProblemType::TooManyStreams,
        ProblemType::InsufficientFunds,
        ProblemType::VersionConflict,
        ProblemType::UnknownTargetWallet,
        ProblemType::CurrencyMismatch,
        ProblemType::SameWallet,
        ProblemType::RaceLabSwitchesOff,
        ProblemType::LabPassInvalid,
        ProblemType::LabWalletsOnly,
        ProblemType::ProviderSignatureInvalid,
        ProblemType::EventPayloadChanged,
        ProblemType::EventInFlight,
        ProblemType::DepositWalletUnknown,
        ProblemType::DepositCurrencyMismatch,
        ProblemType::DepositAmountOverLimit,
        ProblemType::DepositEventTooOld,
        ProblemType::DepositEventInFuture,
        ProblemType::PayoutsNotOffered,
        ProblemType::PayoutRefused,
        ProblemType::PayoutNeedsAttention,
        ProblemType::Overloaded,
        ProblemType::ServiceUnavailable,
        ProblemType::OutcomeUnknown,
        ProblemType::InternalError,
    ];

    fn entry(self) -> Entry {
        use ProblemType::*;
        let (slug, status, title, for_people, description) = match self {
            MalformedRequest => (
                "malformed-request",
                StatusCode::BAD_REQUEST,
                "Malformed request",
                "We could not read what your browser sent. Reload the page and try again.",
                "The body is not valid JSON, or a header the deployment requires (such as Idempotency-Key) is missing. Nothing was changed.",
            ),
            ValidationFailed => (
                "validation-failed",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The request is not valid",
                "Something in the form is not valid. Check the recipient and the amount, then try again.",
                "A value broke a rule: amounts are positive integers of minor units up to the maximum, the wallets differ, the key is a UUID. Nothing was changed.",
            ),
            Unauthorized => (
                "unauthorized",
                StatusCode::UNAUTHORIZED,
                "Authentication required",
                "Your session has ended. Please sign in again.",
                "Send a valid bearer token: from POST /api/v1/users or POST /api/v1/tokens. A revoked or expired token is refused like a missing one. Nothing was changed.",
            ),
            CsrfTokenInvalid => (
                "csrf-token-invalid",
                StatusCode::FORBIDDEN,
                "CSRF token missing or invalid",
                "This form expired. Reload the page and try again.",
                "A browser request authenticated by the session cookie must carry the page's CSRF token. Nothing was changed.",
            ),
            NotYourWallet => (
                "not-your-wallet",
                StatusCode::FORBIDDEN,
                "Not your wallet",
                "You can only send money from your own wallet.",
                "Only the owner of a wallet can send money from it. Nothing was changed.",
            ),
            NotFound => (
                "not-found",
                StatusCode::NOT_FOUND,
                "Not found",
                "There is nothing here, or it is not yours.",
                "There is nothing at this address, or it is not yours.",
            ),
            MethodNotAllowed => (
                "method-not-allowed",
                StatusCode::METHOD_NOT_ALLOWED,
                "Method not allowed",
                "This address does not take that kind of request.",
                "The path exists, but not for this method. The Allow header lists the methods it takes. Nothing was changed.",
            ),
            NameTaken => (
                "name-taken",
                StatusCode::CONFLICT,
                "Name taken",
                "That name is taken, or looks too much like someone else's. Please pick another.",
                "Another user has this name, or a name that reads the same: names are compared after Unicode NFKC normalisation and case folding, and refused when their UTS #39 confusable skeleton matches an existing name's. Nothing was changed.",
            ),
            PayloadTooLarge => (
                "payload-too-large",
                StatusCode::PAYLOAD_TOO_LARGE,
                "Request body too large",
                "What you sent is too large.",
                "The body is larger than request_body_bytes_max. Nothing was changed.",
            ),
            BodyTooSlow => (
                "body-too-slow",
                StatusCode::REQUEST_TIMEOUT,
                "Request body too slow",
                "What you sent took too long to arrive. Check your connection and try again.",
                "The body did not arrive whole within http_request_body_wait_ms_max of the request's head, so it was not read, and the connection is closed. Nothing was changed.",
            ),
            UnsupportedMediaType => (
                "unsupported-media-type",
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "Unsupported media type",
                "Your browser sent the form in a format we do not accept. Reload the page and try again.",
                "Send JSON with Content-Type: application/json. Nothing was changed.",
            ),
            IdempotencyKeyReused => (
                "idempotency-key-reused",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Idempotency key reused",
                "This form was already used for a different transfer, so nothing was sent. Check the form below and send again.",
                "The Idempotency-Key was already used for a request with a different method, path or body. Nothing was changed. Use a new key for a new transfer.",
            ),
            IdempotencyKeyInFlight => (
                "idempotency-key-in-flight",
                StatusCode::CONFLICT,
                "Request with this key still in progress",
                "This transfer is still being processed. Wait a moment, then send the same form again to see its result.",
                "The first request with this Idempotency-Key had not finished within idempotency_wait_ms_max. Retry with the same key after Retry-After to get its result.",
            ),
            CooldownActive => (
                "cooldown-active",
                StatusCode::TOO_MANY_REQUESTS,
                "Too soon after your last transfer",
                "You sent a transfer moments ago. Transfers are spaced a few seconds apart so that duplicates cannot slip through; please try again shortly.",
                "A transfer by you started within the cooldown window (cooldown_ttl_ms). The Redis cooldown lock refused this one before any database work, so nothing was changed. Retry after the Retry-After header's seconds; a retry with the same Idempotency-Key then replays or completes exactly once.",
            ),
            TooManyAttempts => (
                "too-many-attempts",
                StatusCode::TOO_MANY_REQUESTS,
                "Too many attempts",
                "There have been too many attempts from here or for this name. Please wait a little and try again.",
                "Sign-ups and sign-ins are limited per client address and per name (signup_per_address_per_hour_max, signup_per_name_per_hour_max, signin_per_address_per_minute_max, signin_per_name_per_minute_max), shared by every instance. Nothing was changed. Retry after the Retry-After header's seconds.",
            ),
            TooManyStreams => (
                "too-many-streams",
                StatusCode::TOO_MANY_REQUESTS,
                "Too many live feeds",
                "You have too many live feeds open. Close one and try again.",
                "Each user may hold decision_streams_per_user_max live decision streams on an instance at once. Close one, or wait for one to end, and retry.",
            ),
            InsufficientFunds => (
                "insufficient-funds",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Insufficient funds",
                "Your balance is too low for this amount. Nothing was sent.",
                "The guarded debit found the source balance lower than the amount. Nothing moved. A retry with the same key replays this answer.",
            ),
            VersionConflict => (
                "version-conflict",
                StatusCode::CONFLICT,
                "The balance changed while this transfer was decided",
                "Another transfer changed this balance at the same moment. Nothing was sent; send the same form again.",
                "Demonstration mode optimistic_version only: between reading the source wallet's balance and writing it back, another write changed it, so this transfer's compare-and-set matched no row. Nothing was changed and the key was not used. Retry with the same Idempotency-Key, after a random pause of up to an exponentially growing bound (full jitter).",
            ),
            UnknownTargetWallet => (
                "unknown-target-wallet",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Unknown target wallet",
                "We could not find the recipient's wallet. Nothing was sent.",
                "No wallet has the id given as to_wallet_id. Nothing moved.",
            ),
            CurrencyMismatch => (
                "currency-mismatch",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The wallets hold different currencies",
                "The recipient's wallet holds a different currency, and this service does not convert money. Nothing was sent.",
                "The source and target wallets hold different currencies; the row guard never moves minor units from one currency to another. Nothing moved.",
            ),
            SameWallet => (
                "same-wallet",
                StatusCode::UNPROCESSABLE_ENTITY,
                "A transfer needs two wallets",
                "You chose the same wallet to send from and to. Choose another wallet to send to.",
                "from_wallet_id and to_wallet_id name the same wallet: a transfer moves money between two wallets. A rule \
                 no schema states; `errors` points at `#/to_wallet_id`. Nothing moved.",
            ),
            RaceLabSwitchesOff => (
                "race-lab-switches-off",
                StatusCode::FORBIDDEN,
                "Race-lab switches are turned off here",
                "This deployment runs every race-lab request through all three defenses, so layers cannot be switched off. Nothing was sent.",
                "The request carried a Race-Lab-Switches header, and this deployment has race_lab_switches_enabled off. Send the request without the header. Nothing was changed.",
            ),
            LabPassInvalid => (
                "race-lab-pass-invalid",
                StatusCode::FORBIDDEN,
                "Race-lab switches without a valid pass",
                "Only the race lab's own runs can switch a defense off. Start a run from the race lab page. Nothing was sent.",
                "The request carried a Race-Lab-Switches header without a valid Race-Lab-Pass: switches are honoured only on the requests a race-lab run sends itself, each with a pass minted for that visitor, run and shot, accepted once and only before it expires. Send the request without the header. Nothing was changed.",
            ),
            LabWalletsOnly => (
                "lab-wallets-only",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Switches apply to lab wallets only",
                "Switching a defense off is only possible between your two lab wallets, never with real money. Nothing was sent.",
                "The request carried a Race-Lab-Switches header, but its wallets are not both the caller's own race-lab wallets. The wallets were checked before any layer, and the naive statements match lab rows only. Nothing was changed.",
            ),
            ProviderSignatureInvalid => (
                "provider-signature-invalid",
                StatusCode::UNAUTHORIZED,
                "Provider signature missing or invalid",
                "This address is for the payment provider only.",
                "Deposits must be signed in one of two schemes, under a secret in provider_webhook_secrets, at a time within provider_signature_tolerance_s of the server's clock: a Provider-Signature header, t=<unix seconds>,v1=<hex HMAC-SHA256 of t, a dot and the body>; or Standard Webhooks, with webhook-id (the body's event_id), webhook-timestamp and webhook-signature (v1,<base64 HMAC-SHA256 of the id, the timestamp and the body, joined by dots>) under a whsec_ secret. User tokens are not accepted here. Nothing was stored.",
            ),
            EventPayloadChanged => (
                "event-payload-changed",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Event delivered again with different contents",
                "This deposit was already received with different details, so nothing was changed.",
                "An event with this event_id was delivered before with different contents. The first delivery stands; this one credited nothing and is not stored, so a faithful redelivery still gets the first delivery's answer. Counted and logged as a provider error.",
            ),
            EventInFlight => (
                "event-in-flight",
                StatusCode::CONFLICT,
                "Another delivery of this event is still running",
                "This deposit is still being processed. Nothing more is needed from you.",
                "The first delivery of this event had not finished within the edge's and the inbox's waits (event_duplicate_wait_ms_max, inbox_wait_ms_max). This delivery changed nothing. Deliver it again after Retry-After to get the event's answer.",
            ),
            DepositWalletUnknown => (
                "deposit-wallet-unknown",
                StatusCode::UNPROCESSABLE_ENTITY,
                "No such wallet for a deposit",
                "We could not find the wallet this deposit was meant for. Nothing was credited.",
                "No wallet that can receive deposits has the id given as wallet_id (race-lab and clearing wallets cannot). Nothing was credited. Stored: every delivery of the event gets this answer, so a provider may stop retrying it.",
            ),
            DepositCurrencyMismatch => (
                "deposit-currency-mismatch",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The wallet holds another currency",
                "The wallet holds a different currency than this deposit, and this service does not convert money. Nothing was credited.",
                "The wallet's currency is not the deposit's; minor units are never converted. Nothing was credited. Stored: every delivery of the event gets this answer.",
            ),
            DepositAmountOverLimit => (
                "deposit-amount-over-limit",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Deposit over the limit",
                "This deposit is larger than a single deposit may be. Nothing was credited.",
                "amount_minor is larger than deposit_amount_minor_max. Nothing was credited. Stored: every delivery of the event gets this answer.",
            ),
            DepositEventTooOld => (
                "deposit-event-too-old",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Deposit event too old",
                "This deposit is too old to be told apart from one already credited, so it needs a person to check it. Nothing was credited.",
                "occurred_at is further back than deposit_event_age_hours_max: the inbox may have forgotten an earlier delivery of it, so it is never applied. Nothing was credited; reconcile it by hand.",
            ),
            DepositEventInFuture => (
                "deposit-event-in-future",
                StatusCode::UNPROCESSABLE_ENTITY,
                "Deposit event dated in the future",
                "This deposit is dated later than it can have happened, so it needs a person to check it. Nothing was credited.",
                "occurred_at lies further ahead of the server's clock than provider_signature_tolerance_s. Such an event would outlive the inbox's memory of it and could be credited twice, so it is never applied. Nothing was credited. Stored: every delivery of the event gets this answer.",
            ),
            PayoutsNotOffered => (
                "payouts-not-offered",
                StatusCode::NOT_FOUND,
                "This deployment sends no payouts",
                "Payouts to a bank account are not offered here. Nothing was changed.",
                "No bank gateway is configured (payout_gateway_url is empty), so no payout can be made. Nothing was changed.",
            ),
            PayoutRefused => (
                "payout-refused",
                StatusCode::UNPROCESSABLE_ENTITY,
                "The bank refused the payout",
                "The bank refused this payout for good, for example because the account is closed. No money left your wallet: the amount that was set aside is available again.",
                "The bank gateway answered with a definitive refusal (its reason is in the payout's reason). No money was sent; the hold was released, so the amount is back in the available balance. Sending it again to the same destination will be refused again.",
            ),
            PayoutNeedsAttention => (
                "payout-needs-attention",
                StatusCode::SERVICE_UNAVAILABLE,
                "Payout outcome not known yet",
                "We could not get an answer from the bank about this payout, so we cannot tell yet whether the money was sent. The amount stays set aside until we find out; do not send it again.",
                "Every gateway call (payout_attempts_max) ended in a time-out, a 5xx or a broken connection, so the money may or may not have left. The hold stays: nothing is released on an unknown outcome. An operator runs wallet-server reconcile, which asks the gateway by the payout's key and settles or releases it from the answer. Do not make a new payout for the same money meanwhile.",
            ),
            Overloaded => (
                "overloaded",
                StatusCode::SERVICE_UNAVAILABLE,
                "Too busy right now",
                "We are handling as many payments as we can at this moment. Nothing was changed; please try again in a moment.",
                "This instance was already running transfers_in_flight_max transfers, with transfers_admission_queue_max more waiting for a place or none finished within transfers_admission_wait_ms_max, so this one was refused before it started, rather than queued until it would time out. Nothing was changed; retrying after Retry-After is safe, with the same Idempotency-Key. Clients that all retry at once should spread their retries (full jitter), or they meet the same crowd again.",
            ),
            ServiceUnavailable => (
                "service-unavailable",
                StatusCode::SERVICE_UNAVAILABLE,
                "Service temporarily unavailable",
                "The service is briefly unavailable. Nothing was changed; please try again in a moment.",
                "A store the service depends on is unreachable or saturated, or PostgreSQL rolled the work back (a timeout, a shutdown). Nothing was changed; retrying after Retry-After is safe.",
            ),
            OutcomeUnknown => (
                "outcome-unknown",
                StatusCode::SERVICE_UNAVAILABLE,
                "Outcome unknown",
                "We lost contact with the database while your request was being handled, so we cannot tell yet whether it went through. Send this same form again in a moment: it is safe, the transfer or payout either happens once or shows as already done.",
                "The connection to PostgreSQL broke after the transfer was sent to it, so the service cannot tell whether it committed. Retry with the same Idempotency-Key after Retry-After: the retry replays the committed transfer, or makes it exactly once. Without a key, look for the transfer in GET /api/v1/transfers before retrying, or you may pay twice.",
            ),
            InternalError => (
                "internal-error",
                StatusCode::INTERNAL_SERVER_ERROR,
                "Internal error",
                "Something went wrong on our side. Check your history before trying again.",
                "Something failed on our side. If it was a transfer, retry with the same Idempotency-Key (which replays it if it was made), or look for it in GET /api/v1/transfers before retrying without one.",
            ),
        };
        Entry {
            slug,
            status,
            title,
            for_people,
            description,
        }
    }

    pub fn slug(self) -> &'static str {
        self.entry().slug
    }

    pub fn status(self) -> StatusCode {
        self.entry().status
    }

    pub fn title(self) -> &'static str {
        self.entry().title
    }

    /// The sentence the browser shows a person for this problem.
    pub fn for_people(self) -> &'static str {
        self.entry().for_people
    }

    /// What the problem means, for `GET /problems/{slug}`.
    pub fn description(self) -> &'static str {
        self.entry().description
    }

    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| kind.slug() == slug)
    }

    /// The type of a stored problem body (`"type": "/problems/<slug>"`).
    pub fn of_body(body: &str) -> Option<Self> {
        #[derive(serde::Deserialize)]
        struct Typed<'a> {
            #[serde(rename = "type", borrow)]
            uri: Cow<'a, str>,
        }
        let typed: Typed<'_> = serde_json::from_str(body).ok()?;
        Self::from_slug(typed.uri.strip_prefix("/problems/")?)
    }
}

#[cfg(test)]
mod tests;
