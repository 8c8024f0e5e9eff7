-- Users, their wallets and the money that moves between them.
--
-- Every rule the service enforces in Rust is repeated here as a constraint, so
-- that a bug in the application (or a hand-written query) cannot produce a
-- negative balance, a zero transfer or a self-transfer.

CREATE TABLE users (
    id            uuid        PRIMARY KEY,
    name          text        NOT NULL UNIQUE
                              CHECK (char_length(name) BETWEEN 1 AND 64),
    password_hash text        NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- Bearer tokens are stored only as the SHA-256 of the token string; the token
-- itself is shown once, at issue, and never again.
CREATE TABLE api_tokens (
    token_hash bytea       PRIMARY KEY CHECK (octet_length(token_hash) = 32),
    user_id    uuid        NOT NULL REFERENCES users (id),
    created_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE INDEX api_tokens_expires_at_idx ON api_tokens (expires_at);

CREATE TABLE wallets (
    id                    uuid        PRIMARY KEY,
    user_id               uuid        NOT NULL REFERENCES users (id),
    currency              text        NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    -- The signup grant. Each balance must always equal this plus the sum of
    -- the wallet's ledger entries; the tests and the load test check it.
    opening_balance_minor bigint      NOT NULL CHECK (opening_balance_minor >= 0),
    balance_minor         bigint      NOT NULL CHECK (balance_minor >= 0),
    created_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX wallets_user_id_idx ON wallets (user_id);

CREATE TABLE transfers (
    id              uuid        PRIMARY KEY,
    from_wallet_id  uuid        NOT NULL REFERENCES wallets (id),
    to_wallet_id    uuid        NOT NULL REFERENCES wallets (id),
    amount_minor    bigint      NOT NULL CHECK (amount_minor > 0),
    initiated_by    uuid        NOT NULL REFERENCES users (id),
    idempotency_key uuid,
    created_at      timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT transfers_distinct_wallets CHECK (from_wallet_id <> to_wallet_id)
);
CREATE INDEX transfers_from_wallet_idx ON transfers (from_wallet_id, created_at DESC, id DESC);
CREATE INDEX transfers_to_wallet_idx ON transfers (to_wallet_id, created_at DESC, id DESC);

-- Double entry: every transfer writes exactly two rows, -amount on the source
-- and +amount on the target, so the entries of one transfer sum to zero.
CREATE TABLE ledger_entries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transfer_id  uuid        NOT NULL REFERENCES transfers (id),
    wallet_id    uuid        NOT NULL REFERENCES wallets (id),
    amount_minor bigint      NOT NULL CHECK (amount_minor <> 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_wallet_idx ON ledger_entries (wallet_id);
CREATE INDEX ledger_entries_transfer_idx ON ledger_entries (transfer_id);

-- The idempotency layer's claims. The primary key is the claim: of two
-- transactions inserting the same (user_id, key), the second waits for the
-- first and then sees its row. The response is written by the same
-- transaction as the transfer, so a committed claim always has one.
CREATE TABLE idempotency_keys (
    user_id         uuid        NOT NULL REFERENCES users (id),
    key             uuid        NOT NULL,
    fingerprint     bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    response_status smallint    CHECK (response_status BETWEEN 200 AND 499),
    -- text, not jsonb: a replay must return the original bytes, and jsonb
    -- would normalise key order and whitespace.
    response_body   text,
    transfer_id     uuid        REFERENCES transfers (id),
    created_at      timestamptz NOT NULL DEFAULT now(),
    expires_at      timestamptz NOT NULL,
    PRIMARY KEY (user_id, key)
);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);
