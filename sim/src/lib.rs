//! `wallet-sim`: the outside world that sends Layered Wallet money, made to
//! misbehave on purpose. A payment provider that signs its deposit webhooks,
//! retries them with backoff and full jitter, and delivers duplicates; an
//! issuer that publishes transfer commands to Redis Streams while the
//! consumers are killed and stalled. Each run ends with the database's
//! verdict: every event and command applied exactly once, money conserved.
//! And a bank gateway that money leaves through, deduplicating by
//! idempotency key like a real payment API and misbehaving on purpose, with
//! a run of payouts through it whose verdict reads both ledgers.

pub mod accounts;
pub mod broker_run;
pub mod checks;
pub mod gateway;
pub mod instances;
pub mod payout_run;
pub mod provider;
pub mod provider_run;
