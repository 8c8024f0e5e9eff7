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

-- What a claim that found its row already there answers, from the row
-- found: a different fingerprint is another request under the same key;
-- the same one is a replay once answered, and in flight until then. (No
-- row found at all reads as a reused key: nothing may be replayed.)
-- claim_first() and transfer_batch()'s claims both decide by it.
CREATE FUNCTION claim_verdict_of_stored(p_stored_fingerprint bytea, p_fingerprint bytea, p_answered boolean)
RETURNS claim_verdict
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN p_stored_fingerprint IS DISTINCT FROM p_fingerprint THEN 'key_reused'::claim_verdict
        WHEN p_answered THEN 'replayed'::claim_verdict
        ELSE 'in_flight'::claim_verdict
    END
$$;

-- The insert-first claim, one algorithm for both tables that answer a
-- request once: idempotency_keys (a client's key, below) and inbox (a
-- message from outside, 20261202000011_inbox_and_deposits.sql). Each keeps
-- a row per request with its fingerprint, its expiry and, once answered,
-- its response_status and the rest of its answer. p_claim is the row a
-- new request would insert; its type, the table's row type, names the
-- table, and p_key_columns the columns that name its row. stored is the
-- row found, for its answer.
--
-- An answered, live row never changes until it expires, so a retry of it
-- is a read alone: no insert attempt, no subtransaction, no write.
-- Otherwise the insert waits for a concurrent claim of the same row at
-- most p_wait_ms (a transaction-local lock_timeout):
--   'started'     the row is ours; do the work in this transaction;
--   'replayed'    an answered request with the same fingerprint: stored
--                 holds its answer;
--   'key_reused'  the row was claimed for a different request;
--   'in_flight'   the first request did not finish within the wait.
-- An expired row still waiting for the sweeper is taken over (deleted,
-- then claimed afresh): after expiry the same key is a new request.
--
-- The table being an argument, each statement is built here (names
-- quoted by format's %I) and planned on every call: a few microseconds a
-- statement, the price of writing the claim once for both tables.
CREATE FUNCTION claim_first(
    p_claim anyelement,
    p_key_columns text[],
    p_wait_ms int,
    OUT outcome claim_verdict,
    OUT stored anyelement
)
LANGUAGE plpgsql AS $$
DECLARE
    v_table text := pg_typeof(p_claim)::text;
    -- Matches p_claim's row (t) by its key; $1 is p_claim.
    v_its_row text := (
        SELECT string_agg(format('t.%1$I = ($1).%1$I', key_column), ' AND ')
          FROM unnest(p_key_columns) AS key_column);
    v_rows bigint;
BEGIN
    EXECUTE format(
        'SELECT t.* FROM %s t WHERE %s AND t.response_status IS NOT NULL AND t.expires_at > now()',
        v_table, v_its_row)
       INTO stored USING p_claim;
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    IF v_rows = 0 THEN
        PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
        BEGIN
            EXECUTE format('DELETE FROM %s t WHERE %s AND t.expires_at <= now()', v_table, v_its_row)
              USING p_claim;
            EXECUTE format('INSERT INTO %s SELECT ($1).* ON CONFLICT DO NOTHING', v_table) USING p_claim;
            GET DIAGNOSTICS v_rows = ROW_COUNT;
            IF v_rows = 1 THEN
                outcome := 'started';
                RETURN;
            END IF;
        EXCEPTION WHEN lock_not_available THEN
            outcome := 'in_flight';
            RETURN;
        END;

        -- The conflicting claim has committed (the insert waited for it),
        -- and this statement's fresh snapshot sees it, answer included.
        EXECUTE format('SELECT t.* FROM %s t WHERE %s', v_table, v_its_row) INTO stored USING p_claim;
    END IF;

    outcome := claim_verdict_of_stored(stored.fingerprint, p_claim.fingerprint, stored.response_status IS NOT NULL);
    IF outcome = 'key_reused' THEN
        stored := NULL;
    END IF;
END
$$;

-- The claim of a client's key (claim_first(), which says what each
-- outcome means), with the stored response of a replay.
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
DECLARE
    v_claim idempotency_keys;
    v_claimed record;
    v_stored idempotency_keys;
BEGIN
    v_claim.user_id := p_user;
    v_claim.key := p_key;
    v_claim.fingerprint := p_fingerprint;
    v_claim.created_at := now();
    v_claim.expires_at := now() + make_interval(hours => p_retention_hours);
    SELECT * INTO v_claimed FROM claim_first(v_claim, '{user_id,key}', p_wait_ms);
    outcome := v_claimed.outcome;
    v_stored := v_claimed.stored;
    response_status := v_stored.response_status;
    response_body := v_stored.response_body;
    response_refusal := v_stored.response_refusal;
    response_trace_id := v_stored.response_trace_id;
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
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE idempotency_keys
       SET response_status = CASE WHEN p_outcome = 'accepted' THEN p_accepted_status ELSE 422 END,
           response_body = CASE WHEN p_outcome = 'accepted' THEN p_receipt END,
           response_refusal = CASE WHEN p_outcome <> 'accepted' THEN p_outcome END,
           response_trace_id = p_trace_id,
           transfer_id = CASE WHEN p_outcome = 'accepted' THEN p_transfer_id END
     WHERE user_id = p_user AND key = p_key;
END
$$;
