-- A typed protocol between the server and the database.
--
-- Each layer's answer is a PostgreSQL enum, decoded one to one into a Rust
-- enum (#[derive(sqlx::Type)]), in the vocabulary of the decision feed:
-- 'accepted', 'replayed', 'key_reused', 'in_flight'. A value one side does
-- not know fails to decode; it is never guessed at.
--
-- Business refusals are stored with the claim by kind (and the trace id of
-- the request that decided), not as a body: the server renders the problem
-- from its catalogue (backend/src/problem.rs) when it sends it, so nothing
-- is serialised for refusals a request never meets. A receipt is still
-- stored as text, byte for byte. The stored response is written by one
-- function, idempotency_complete(), which both transfer paths call.
--
-- A retry of a completed key is a read: idempotency_claim() looks the key
-- up before it tries to claim it, so a replay takes no insert attempt, no
-- subtransaction and no write.

CREATE TYPE claim_outcome AS ENUM ('started', 'replayed', 'key_reused', 'in_flight');

CREATE TYPE guard_outcome AS ENUM (
    'accepted', 'insufficient_funds', 'unknown_target', 'currency_mismatch', 'not_owner');

-- Why transfer() refused before the layers; nothing is written.
CREATE TYPE access_refusal AS ENUM ('token_not_live', 'not_owner');

ALTER TABLE idempotency_keys
    ADD COLUMN response_refusal guard_outcome,
    ADD COLUMN response_trace_id text CHECK (length(response_trace_id) <= 64),
    -- A completed claim holds exactly one of a body and a refusal.
    ADD CONSTRAINT idempotency_keys_one_response CHECK (
        response_status IS NULL OR ((response_body IS NULL) <> (response_refusal IS NULL))),
    ADD CONSTRAINT idempotency_keys_refusal_refuses CHECK (
        response_refusal IS NULL OR response_refusal NOT IN ('accepted', 'not_owner'));

DROP FUNCTION transfer(uuid, bytea, uuid, bytea, int, int, int, uuid, uuid, uuid, bigint, text, text, text);
DROP FUNCTION row_guard_transfer(uuid, uuid, uuid, uuid, bigint, uuid, int);
DROP FUNCTION idempotency_claim(uuid, uuid, bytea, int, int);

-- Layer 2, as in 20261130000002, answering in claim_outcome and reading a
-- completed key before trying to claim it.
CREATE FUNCTION idempotency_claim(
    p_user uuid,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_wait_ms int,
    OUT outcome claim_outcome,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_refusal guard_outcome,
    OUT response_trace_id text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_fingerprint bytea;
BEGIN
    -- A completed, live claim never changes until it expires: a retry of it
    -- is answered from this read alone.
    SELECT k.fingerprint, k.response_status, k.response_body, k.response_refusal, k.response_trace_id
      INTO v_fingerprint, response_status, response_body, response_refusal, response_trace_id
      FROM idempotency_keys k
     WHERE k.user_id = p_user AND k.key = p_key
       AND k.response_status IS NOT NULL AND k.expires_at > now();
    IF NOT FOUND THEN
        PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
        BEGIN
            INSERT INTO idempotency_keys (user_id, key, fingerprint, expires_at)
            VALUES (p_user, p_key, p_fingerprint, now() + make_interval(hours => p_retention_hours))
            ON CONFLICT (user_id, key) DO UPDATE
                SET fingerprint = EXCLUDED.fingerprint,
                    response_status = NULL,
                    response_body = NULL,
                    response_refusal = NULL,
                    response_trace_id = NULL,
                    transfer_id = NULL,
                    created_at = now(),
                    expires_at = EXCLUDED.expires_at
                WHERE idempotency_keys.expires_at <= now();
            IF FOUND THEN
                outcome := 'started';
                RETURN;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            outcome := 'in_flight';
            RETURN;
        END;

        -- The conflicting claim has committed (the insert waited for it),
        -- and this statement's fresh snapshot sees it, response included.
        SELECT k.fingerprint, k.response_status, k.response_body, k.response_refusal, k.response_trace_id
          INTO v_fingerprint, response_status, response_body, response_refusal, response_trace_id
          FROM idempotency_keys k
         WHERE k.user_id = p_user AND k.key = p_key;
    END IF;

    IF v_fingerprint IS DISTINCT FROM p_fingerprint THEN
        outcome := 'key_reused';
        response_status := NULL;
        response_body := NULL;
        response_refusal := NULL;
        response_trace_id := NULL;
    ELSIF response_status IS NULL THEN
        outcome := 'in_flight';
    ELSE
        outcome := 'replayed';
    END IF;
END
$$;

-- The stored response, written by this function alone: transfer() and the
-- statement-by-statement path both call it, in the transaction that did the
-- work. A receipt is stored as its body; a business refusal as its kind
-- and the trace id of the request that decided it. Every business refusal
-- is a 422 (the catalogue in backend/src/problem.rs says so, and a test
-- checks it).
CREATE FUNCTION idempotency_complete(
    p_user uuid,
    p_key uuid,
    p_outcome guard_outcome,
    p_receipt text,
    p_trace_id text,
    p_transfer_id uuid
)
RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency_keys
       SET response_status = CASE WHEN p_outcome = 'accepted' THEN 201 ELSE 422 END,
           response_body = CASE WHEN p_outcome = 'accepted' THEN p_receipt END,
           response_refusal = CASE WHEN p_outcome <> 'accepted' THEN p_outcome END,
           response_trace_id = p_trace_id,
           transfer_id = CASE WHEN p_outcome = 'accepted' THEN p_transfer_id END
     WHERE user_id = p_user AND key = p_key
$$;

-- Layer 3, as in 20261201000005, answering in guard_outcome.
CREATE FUNCTION row_guard_transfer(
    p_transfer_id uuid,
    p_user uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_key uuid,
    p_wait_ms int,
    OUT outcome guard_outcome,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_source_owner uuid;
    v_source_currency text;
    v_target_currency text;
    v_wallet record;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    FOR v_wallet IN
        SELECT w.id, w.user_id, w.currency FROM wallets w
         WHERE w.id IN (p_from, p_to)
         ORDER BY w.id
           FOR NO KEY UPDATE
    LOOP
        IF v_wallet.id = p_from THEN
            v_source_owner := v_wallet.user_id;
            v_source_currency := v_wallet.currency;
        ELSE
            v_target_currency := v_wallet.currency;
        END IF;
    END LOOP;
    IF v_source_owner IS DISTINCT FROM p_user THEN
        outcome := 'not_owner';
        RETURN;
    END IF;
    IF v_target_currency IS NULL THEN
        outcome := 'unknown_target';
        RETURN;
    END IF;
    IF v_target_currency <> v_source_currency THEN
        outcome := 'currency_mismatch';
        RETURN;
    END IF;

    -- The guard: check and write in one statement.
    UPDATE wallets SET balance_minor = balance_minor - p_amount
     WHERE id = p_from AND balance_minor >= p_amount
    RETURNING balance_minor INTO balance_minor_after;
    IF NOT FOUND THEN
        outcome := 'insufficient_funds';
        RETURN;
    END IF;

    UPDATE wallets SET balance_minor = balance_minor + p_amount WHERE id = p_to;
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, idempotency_key)
    VALUES (p_transfer_id, p_from, p_to, p_amount, p_user, p_key)
    RETURNING transfers.created_at INTO created_at;
    -- Double entry: the pair sums to zero.
    INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
    VALUES (p_transfer_id, p_from, -p_amount), (p_transfer_id, p_to, p_amount);
    outcome := 'accepted';
END
$$;

-- The whole transfer transaction in one call (one round trip), as in
-- 20261201000008: access (read-only, so a refusal writes nothing), layer 2,
-- layer 3, the response stored with the claim. It takes the request's trace
-- id instead of three pre-rendered refusal bodies.
--
-- refused: why access was refused (nothing else is set), or NULL.
-- claim, claim_ms: layer 2's answer and its time here, when a key was sent.
-- guard, guard_ms: layer 3's answer and its time, when it ran.
-- response_*: the response to send, fresh or replayed, in the columns of
-- idempotency_keys.
CREATE FUNCTION transfer(
    p_user uuid,
    p_token_hash bytea,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int,
    p_transfer_id uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_trace_id text,
    OUT refused access_refusal,
    OUT claim claim_outcome,
    OUT claim_ms double precision,
    OUT guard guard_outcome,
    OUT guard_ms double precision,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_refusal guard_outcome,
    OUT response_trace_id text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_guard record;
    v_started timestamptz;
BEGIN
    IF NOT token_is_live(p_token_hash, p_user) THEN
        refused := 'token_not_live';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM wallets w WHERE w.id = p_from AND w.user_id = p_user) THEN
        refused := 'not_owner';
        RETURN;
    END IF;

    -- Layer 2: the idempotency claim.
    IF p_key IS NOT NULL THEN
        v_started := clock_timestamp();
        SELECT * INTO v_claim
          FROM idempotency_claim(p_user, p_key, p_fingerprint, p_retention_hours, p_claim_wait_ms);
        claim := v_claim.outcome;
        claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
        IF claim <> 'started' THEN
            response_status := v_claim.response_status;
            response_body := v_claim.response_body;
            response_refusal := v_claim.response_refusal;
            response_trace_id := v_claim.response_trace_id;
            RETURN;
        END IF;
    END IF;

    -- Layer 3: the row guard.
    v_started := clock_timestamp();
    SELECT * INTO v_guard
      FROM row_guard_transfer(p_transfer_id, p_user, p_from, p_to, p_amount, p_key, p_wallet_wait_ms);
    guard := v_guard.outcome;
    guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    IF guard = 'not_owner' THEN
        -- Ownership was checked above and never changes.
        RAISE EXCEPTION 'row guard refused an owner';
    END IF;
    balance_minor_after := v_guard.balance_minor_after;
    created_at := v_guard.created_at;
    IF guard = 'accepted' THEN
        response_status := 201;
        response_body := transfer_receipt(
            p_transfer_id, p_from, p_to, p_amount, v_guard.created_at, v_guard.balance_minor_after);
    ELSE
        response_status := 422;
        response_refusal := guard;
    END IF;
    response_trace_id := p_trace_id;

    IF p_key IS NOT NULL THEN
        PERFORM idempotency_complete(p_user, p_key, guard, response_body, p_trace_id, p_transfer_id);
    END IF;
END
$$;
