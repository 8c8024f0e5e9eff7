-- Money that arrives: the inbox (layer 2 for messages from outside) and
-- a payment provider's deposits. backend/src/deposit/ documents the
-- layers; this is their SQL.
--
-- A deposit has no row to lock until it is applied: the only question is
-- whether this event was applied already. The inbox answers it the way
-- idempotency_keys answers it for a client's key: a row under the primary
-- key (source, event_id), inserted first, in the same transaction as the
-- credit, so that of two deliveries of one event the second waits for the
-- first and then reads its answer.

-- 'race_lab': the race lab's deliveries of lab deposits, between a
-- visitor's two lab wallets (20261202000008_race_lab.sql).
CREATE TYPE inbox_source AS ENUM ('provider', 'broker', 'race_lab');
CREATE TYPE inbox_claim_verdict AS ENUM ('started', 'replayed', 'payload_changed', 'in_flight');

-- Each committed row holds the answer every later delivery gets: the
-- verdict, the status, and either the body of a success (byte for byte,
-- as text) or, for a refusal, the trace id of the request that decided it
-- (the server renders the problem from its catalogue, the same bytes each
-- time). A claim without an answer exists only inside the transaction
-- that holds it.
CREATE TABLE inbox (
    source            inbox_source NOT NULL,
    event_id          text         NOT NULL CHECK (event_id ~ '^[A-Za-z0-9_.:-]{1,128}$'),
    fingerprint       bytea        NOT NULL CHECK (octet_length(fingerprint) = 32),
    verdict           text         CHECK (verdict ~ '^[a-z_]{1,32}$'),
    response_status   smallint     CHECK (response_status BETWEEN 200 AND 499),
    response_body     text,
    response_trace_id text         CHECK (length(response_trace_id) <= 64),
    transfer_id       uuid         REFERENCES transfers (id),
    received_at       timestamptz  NOT NULL DEFAULT now(),
    expires_at        timestamptz  NOT NULL,
    PRIMARY KEY (source, event_id),
    CONSTRAINT inbox_answer_whole CHECK ((verdict IS NULL) = (response_status IS NULL))
);
CREATE INDEX inbox_expires_at_idx ON inbox (expires_at);

-- The claim of an event (claim_first(), 20261202000004_idempotency.sql,
-- which says what each outcome means), with the stored answer of a
-- redelivery. The same event id with different contents is
-- 'payload_changed'. The deposit refuses events older than the retention,
-- so a deposit is never applied twice by an expired row's takeover.
CREATE FUNCTION inbox_claim(
    p_source inbox_source,
    p_event_id text,
    p_fingerprint bytea,
    p_retention_hours int,
    p_wait_ms int,
    OUT outcome inbox_claim_verdict,
    OUT verdict text,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_trace_id text,
    OUT transfer_id uuid
)
LANGUAGE plpgsql AS $$
DECLARE
    v_claim inbox;
    v_claimed record;
    v_stored inbox;
BEGIN
    v_claim.source := p_source;
    v_claim.event_id := p_event_id;
    v_claim.fingerprint := p_fingerprint;
    v_claim.received_at := now();
    v_claim.expires_at := now() + make_interval(hours => p_retention_hours);
    SELECT * INTO v_claimed FROM claim_first(v_claim, '{source,event_id}', p_wait_ms);
    outcome := CASE v_claimed.outcome
        WHEN 'key_reused' THEN 'payload_changed'::inbox_claim_verdict
        ELSE v_claimed.outcome::text::inbox_claim_verdict
    END;
    v_stored := v_claimed.stored;
    verdict := v_stored.verdict;
    response_status := v_stored.response_status;
    response_body := v_stored.response_body;
    response_trace_id := v_stored.response_trace_id;
    transfer_id := v_stored.transfer_id;
END
$$;

-- The answer, stored with the claim by the transaction that applied (or
-- refused) the event.
CREATE FUNCTION inbox_complete(
    p_source inbox_source,
    p_event_id text,
    p_verdict text,
    p_status smallint,
    p_body text,
    p_trace_id text,
    p_transfer_id uuid
)
RETURNS void
LANGUAGE sql AS $$
    UPDATE inbox
       SET verdict = p_verdict,
           response_status = p_status,
           response_body = p_body,
           response_trace_id = p_trace_id,
           transfer_id = p_transfer_id
     WHERE source = p_source AND event_id = p_event_id
$$;

-- Layer 3 for a deposit: the credit, under the wallet's row lock, with the
-- currency guard. The money comes from the provider's clearing wallet, so
-- the deposit is a transfer like any other in the ledger: two entries
-- that sum to zero. The person's wallet is locked before the clearing
-- wallet, always in that order (transfers never lock a clearing wallet),
-- so deposits cannot deadlock. Every deposit updates the one clearing
-- row: deposits serialise on it for the moment between that update and
-- the commit.
--   'credited'           credited and recorded;
--   'unknown_wallet'     no such real wallet (lab and clearing wallets
--                        cannot receive deposits); nothing written;
-- With p_lab_clearing, the deposit is the race lab's: into one lab wallet,
-- from the same visitor's other one, and nowhere else.
--   'currency_mismatch'  the wallet holds another currency; nothing written.
-- The remaining values are decided by deposit() before the credit.
CREATE TYPE deposit_verdict AS ENUM (
    'credited', 'unknown_wallet', 'currency_mismatch', 'amount_over_limit', 'event_too_old',
    'event_in_future');

CREATE FUNCTION deposit_credit(
    p_transfer_id uuid,
    p_wallet uuid,
    p_amount bigint,
    p_currency text,
    p_wait_ms int,
    p_lab_clearing uuid,
    OUT outcome deposit_verdict,
    OUT owner uuid,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_currency text;
    v_clearing_wallet uuid;
    v_clearing_owner uuid;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    SELECT w.user_id, w.currency INTO owner, v_currency
      FROM wallets w
     WHERE w.id = p_wallet AND w.clearing_source IS NULL
       AND (w.lab_slot IS NULL) = (p_lab_clearing IS NULL)
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'unknown_wallet';
        owner := NULL;
        RETURN;
    END IF;
    IF v_currency <> p_currency THEN
        outcome := 'currency_mismatch';
        RETURN;
    END IF;
    -- The provider's clearing wallet in the deposit's currency; for a
    -- race-lab deposit, the visitor's other lab wallet, never anyone
    -- else's.
    SELECT w.id, w.user_id INTO v_clearing_wallet, v_clearing_owner
      FROM wallets w
     WHERE CASE WHEN p_lab_clearing IS NULL
                THEN w.clearing_source = 'provider' AND w.currency = p_currency
                ELSE w.id = p_lab_clearing AND w.user_id = owner AND w.lab_slot IS NOT NULL AND w.id <> p_wallet
           END
       FOR NO KEY UPDATE;
    IF NOT FOUND AND p_lab_clearing IS NULL THEN
        RAISE EXCEPTION 'the provider has no clearing wallet in %', p_currency;
    ELSIF NOT FOUND THEN
        outcome := 'unknown_wallet';
        owner := NULL;
        RETURN;
    END IF;

    UPDATE wallets SET balance_minor = balance_minor + p_amount, version = version + 1 WHERE id = p_wallet
    RETURNING balance_minor INTO balance_minor_after;
    UPDATE wallets SET balance_minor = balance_minor - p_amount, version = version + 1 WHERE id = v_clearing_wallet;
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
    VALUES (p_transfer_id, v_clearing_wallet, p_wallet, p_amount, v_clearing_owner)
    RETURNING transfers.created_at INTO created_at;
    INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
    VALUES (p_transfer_id, v_clearing_wallet, -p_amount), (p_transfer_id, p_wallet, p_amount);
    outcome := 'credited';
END
$$;

-- The body of a credited deposit, the same bytes for every delivery.
CREATE FUNCTION deposit_receipt(
    p_event_id text,
    p_transfer_id uuid,
    p_wallet uuid,
    p_amount bigint,
    p_currency text,
    p_created_at timestamptz
)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        '{"event_id":%s,"status":"credited","deposit_id":"%s","wallet_id":"%s","amount_minor":%s,"currency":"%s","credited_at":"%s"}',
        to_json(p_event_id), p_transfer_id, p_wallet, p_amount, p_currency,
        to_char(p_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
$$;

-- The whole deposit in one call, one round trip: the inbox claim, the
-- refusals that depend on nothing but the event (over the limit, older
-- than p_age_hours_max, or more than p_future_s ahead of now), the credit,
-- and the answer stored with the claim. The claim is kept p_retention_hours,
-- longer than the age limit and the future tolerance together, so that
-- every event a swept claim could stand for is refused as too old. Called as one statement, it commits or rolls back as a whole.
-- p_source names the sender in the inbox ('provider', or 'race_lab' with
-- p_lab_clearing for the race lab's deliveries).
-- A refusal is stored like a success, so that every redelivery gets it.
CREATE FUNCTION deposit(
    p_event_id text,
    p_fingerprint bytea,
    p_wallet uuid,
    p_amount bigint,
    p_currency text,
    p_occurred_at timestamptz,
    p_amount_max bigint,
    p_age_hours_max int,
    p_future_s int,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int,
    p_transfer_id uuid,
    p_trace_id text,
    p_source inbox_source,
    p_lab_clearing uuid,
    OUT claim inbox_claim_verdict,
    OUT claim_ms double precision,
    OUT credit_ms double precision,
    OUT verdict text,
    OUT owner uuid,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_trace_id text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_credit record;
    v_started timestamptz;
BEGIN
    v_started := clock_timestamp();
    SELECT * INTO v_claim
      FROM inbox_claim(p_source, p_event_id, p_fingerprint, p_retention_hours, p_claim_wait_ms);
    claim := v_claim.outcome;
    claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    IF claim <> 'started' THEN
        verdict := v_claim.verdict;
        response_status := v_claim.response_status;
        response_body := v_claim.response_body;
        response_trace_id := v_claim.response_trace_id;
        IF v_claim.transfer_id IS NOT NULL THEN
            SELECT w.user_id INTO owner
              FROM transfers t JOIN wallets w ON w.id = t.to_wallet_id
             WHERE t.id = v_claim.transfer_id;
        END IF;
        RETURN;
    END IF;

    v_started := clock_timestamp();
    IF p_amount > p_amount_max THEN
        verdict := 'amount_over_limit';
    ELSIF p_occurred_at < now() - make_interval(hours => p_age_hours_max) THEN
        -- Too old to be told apart from an event whose claim was swept:
        -- had it been applied, its row might be gone, so it is never
        -- applied now.
        verdict := 'event_too_old';
    ELSIF p_occurred_at > now() + make_interval(secs => p_future_s) THEN
        -- Dated ahead of any clock's drift: it would stay young past its
        -- claim's sweep, and a redelivery then would be credited again.
        verdict := 'event_in_future';
    ELSE
        SELECT * INTO v_credit
          FROM deposit_credit(p_transfer_id, p_wallet, p_amount, p_currency, p_wallet_wait_ms, p_lab_clearing);
        verdict := v_credit.outcome::text;
        owner := v_credit.owner;
    END IF;
    credit_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;

    IF verdict = 'credited' THEN
        response_status := 200;
        response_body := deposit_receipt(
            p_event_id, p_transfer_id, p_wallet, p_amount, p_currency, v_credit.created_at);
    ELSE
        response_status := 422;
    END IF;
    response_trace_id := p_trace_id;
    PERFORM inbox_complete(p_source, p_event_id, verdict, response_status, response_body, p_trace_id,
                           CASE WHEN verdict = 'credited' THEN p_transfer_id END);
END
$$;
