-- Wallets and the money that moves between them.
--
-- Every rule the service enforces in Rust is repeated here as a constraint,
-- so that a bug in the application (or a hand-written query) cannot produce
-- a negative balance, a zero transfer or a self-transfer.

-- A wallet's currency is the deployment's `currency` setting when it was
-- made. A race-lab wallet is marked by its slot (NULL for a real wallet)
-- and holds the currency LAB, which no deployment may use for real money.
-- Slots 1 and 2 are the visitor's wallets A and B; slot 3 holds what the
-- lab's payouts hold, as the holds wallet does for real money, and no
-- transfer moves money into or out of it (wallet_out_of_reach()). The row guard refuses to move minor units between currencies, on
-- the guarded and on the naive path, so lab money and real money never
-- meet (20261202000008_race_lab.sql has the lab's functions).
--
-- A clearing wallet (clearing_source set) stands for money outside the
-- service: a deposit moves money from its source's clearing wallet to a
-- person's wallet, so that double entry holds for money that arrives too.
-- The provider's is the one wallet whose balance goes below zero (by what
-- the provider has paid in), and no transfer may target a clearing wallet
-- (20261202000011_inbox_and_deposits.sql has the deposit's functions).
-- Money that leaves has two: 'holds', where a payout's amount waits while
-- the bank gateway is asked, and 'gateway', where it goes once the gateway
-- has sent it (20261202000006_payouts.sql).
--
-- The rules on one column that never changes after its insert are domains,
-- not table CHECKs. PostgreSQL evaluates every CHECK of a table on every
-- UPDATE, reading each back from its stored text first, and a transfer
-- updates two wallets. A domain's rule runs only where a value is stored
-- into its column (an INSERT, or an UPDATE that sets it), which holds every
-- row to the same rule. Profiled on transfer_batch() from one client,
-- CHECKs took 13.2% of the database's CPU with these four as CHECKs, and
-- 9.5% as domains. The rules that span columns stay CHECKs.
CREATE DOMAIN currency_code AS text CHECK (VALUE ~ '^[A-Z]{3}$');
CREATE DOMAIN non_negative_minor AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN lab_slot_number AS smallint CHECK (VALUE IN (1, 2, 3));
CREATE DOMAIN clearing_source_name AS text CHECK (VALUE ~ '^[a-z]{1,32}$');
CREATE TABLE wallets (
    id                    uuid        PRIMARY KEY,
    user_id               uuid        NOT NULL REFERENCES users (id),
    currency              currency_code        NOT NULL,
    -- The sign-up grant. Each balance must always equal this plus the sum
    -- of the wallet's ledger entries; money_invariants() checks it.
    opening_balance_minor non_negative_minor   NOT NULL,
    balance_minor         bigint      NOT NULL,
    -- One more on every change of the balance: every statement that sets
    -- balance_minor also sets version = version + 1 (backend/tests/
    -- migrations.rs holds each to it), so that the optimistic alternative
    -- to the row guard, which writes `… WHERE version = $read`, sees every
    -- writer. In the statement rather than in a trigger, which would cost
    -- every transfer a function call.
    version               bigint      NOT NULL DEFAULT 0,
    created_at            timestamptz NOT NULL DEFAULT now(),
    lab_slot              lab_slot_number,
    clearing_source       clearing_source_name UNIQUE,
    CONSTRAINT wallets_lab_money CHECK ((lab_slot IS NOT NULL) = (currency = 'LAB')),
    CONSTRAINT wallets_never_below_zero CHECK (balance_minor >= 0 OR clearing_source IS NOT DISTINCT FROM 'provider'),
    CONSTRAINT wallets_clearing_is_real_money CHECK (clearing_source IS NULL OR lab_slot IS NULL)
);
CREATE INDEX wallets_user_id_idx ON wallets (user_id);
CREATE UNIQUE INDEX wallets_lab_slot_idx ON wallets (user_id, lab_slot) WHERE lab_slot IS NOT NULL;

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

-- Double entry: every transfer writes exactly two rows, -amount on the
-- source and +amount on the target, so the entries of one transfer sum to
-- zero.
CREATE TABLE ledger_entries (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    transfer_id  uuid        NOT NULL REFERENCES transfers (id),
    wallet_id    uuid        NOT NULL REFERENCES wallets (id),
    amount_minor bigint      NOT NULL CHECK (amount_minor <> 0),
    created_at   timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ledger_entries_wallet_idx ON ledger_entries (wallet_id);
CREATE INDEX ledger_entries_transfer_idx ON ledger_entries (transfer_id);
