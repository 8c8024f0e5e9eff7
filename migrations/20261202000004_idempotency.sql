-- Layer 2, the idempotency key: backend/src/defense/idempotency.rs
-- documents the layer; this is its SQL.
--
-- The claim is an insert under the primary key (user_id, key): of two
-- transactions inserting the same key, the second waits for the first and
-- then sees its row. The response is written by the same transaction as
-- the transfer, so a committed claim always has one.
CREATE TYPE claim_verdict AS ENUM ('started', 'replayed', 'key_reused', 'in_flight');

-- A business refusal is stored by kind (response_refusal, with the trace
-- id of the request that decided it), not as a body: the server renders
-- the problem from its catalogue (backend/src/problem/) when it sends it.
-- A receipt is stored as text, byte for byte, because a replay must return
-- the original bytes (jsonb would normalise key order and whitespace).
CREATE TABLE idempotency_keys (
    user_id           uuid        NOT NULL REFERENCES users (id),
    key               uuid        NOT NULL,
    fingerprint       bytea       NOT NULL CHECK (octet_length(fingerprint) = 32),
    response_status   smallint    CHECK (response_status BETWEEN 200 AND 499),
    response_body     text,
    transfer_id       uuid        REFERENCES transfers (id),
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz NOT NULL,
    response_refusal  guard_verdict,
    response_trace_id text        CHECK (length(response_trace_id) <= 64),
    PRIMARY KEY (user_id, key),
    -- A completed claim holds exactly one of a body and a refusal.
    CONSTRAINT idempotency_keys_one_response CHECK (
        response_status IS NULL OR ((response_body IS NULL) <> (response_refusal IS NULL))),
    CONSTRAINT idempotency_keys_refusal_refuses CHECK (
        response_refusal IS NULL OR response_refusal NOT IN ('accepted', 'not_owner'))
);
CREATE INDEX idempotency_keys_expires_at_idx ON idempotency_keys (expires_at);

-- DEMO ONLY (idempotency_mode = advisory_lock): the advisory lock's id for
-- a user's key, a 32-bit hash as such locks are commonly keyed. Different
-- keys share an id now and then (about one pair in 77,000 keys in flight
-- together has even odds), and then wait for each other: contention that
-- is not real.
CREATE FUNCTION idempotency_lock_id(p_user uuid, p_key uuid)
RETURNS int
LANGUAGE sql IMMUTABLE AS $$
    SELECT hashtext(p_user::text || ':' || p_key::text)
$$;

-- The claim. A retry of a completed, live key is a read alone: no insert
-- attempt, no subtransaction, no write. Otherwise the insert waits for a
-- concurrent claim of the same key at most p_wait_ms (a transaction-local
-- lock_timeout):
--   'started'     the key is ours; do the work in this transaction;
--   'replayed'    a completed request with the same fingerprint: its
--                 stored response;
--   'key_reused'  the key was used for a different request;
--   'in_flight'   the first request did not finish within the wait.
-- An expired claim still waiting for the sweeper is taken over: after
-- expiry the same key is a new request.
CREATE FUNCTION idempotency_claim(
    p_user uuid,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_wait_ms int,
    OUT outcome claim_verdict,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_refusal guard_verdict,
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

-- The stored response, written by this function alone: transfer(), the
-- statement-by-statement path and payout() call it, in the transaction
-- that did the work. An accepted request is answered p_accepted_status (a
-- transfer's 201, a payout's 202); every business refusal is a 422 (the
-- catalogue says so, and a test checks it).
CREATE FUNCTION idempotency_complete(
    p_user uuid,
    p_key uuid,
    p_outcome guard_verdict,
    p_receipt text,
    p_trace_id text,
    p_transfer_id uuid,
    p_accepted_status smallint DEFAULT 201
)
RETURNS void
LANGUAGE sql AS $$
    UPDATE idempotency_keys
       SET response_status = CASE WHEN p_outcome = 'accepted' THEN p_accepted_status ELSE 422 END,
           response_body = CASE WHEN p_outcome = 'accepted' THEN p_receipt END,
           response_refusal = CASE WHEN p_outcome <> 'accepted' THEN p_outcome END,
           response_trace_id = p_trace_id,
           transfer_id = CASE WHEN p_outcome = 'accepted' THEN p_transfer_id END
     WHERE user_id = p_user AND key = p_key
$$;
