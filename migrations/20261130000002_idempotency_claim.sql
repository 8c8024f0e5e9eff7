-- Layer 2, the idempotency claim, as a function, so that the transfer can
-- run in one round trip (see transfer()). backend/src/defense/idempotency.rs
-- documents the layer; this is its SQL.
--
-- The claim is an insert under the primary key (user_id, key). Of two
-- transactions claiming the same key, the second's insert waits for the
-- first to finish, at most p_wait_ms (a transaction-local lock_timeout):
--   'started'   the key is ours; do the work in this transaction;
--   'replay'    a completed request with the same fingerprint: its response;
--   'mismatch'  the key was used for a different request;
--   'in_flight' the first request did not finish within the wait.
-- An expired claim still waiting for the sweeper is taken over: after expiry
-- the same key is a new request.
CREATE FUNCTION idempotency_claim(
    p_user uuid,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_wait_ms int,
    OUT outcome text,
    OUT response_status smallint,
    OUT response_body text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_fingerprint bytea;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    BEGIN
        INSERT INTO idempotency_keys (user_id, key, fingerprint, expires_at)
        VALUES (p_user, p_key, p_fingerprint, now() + make_interval(hours => p_retention_hours))
        ON CONFLICT (user_id, key) DO UPDATE
            SET fingerprint = EXCLUDED.fingerprint,
                response_status = NULL,
                response_body = NULL,
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

    -- The conflicting claim has committed (the insert waited for it), and
    -- this statement's fresh snapshot sees it, response included.
    SELECT k.fingerprint, k.response_status, k.response_body
      INTO v_fingerprint, response_status, response_body
      FROM idempotency_keys k
     WHERE k.user_id = p_user AND k.key = p_key;
    IF v_fingerprint IS DISTINCT FROM p_fingerprint THEN
        outcome := 'mismatch';
        response_status := NULL;
        response_body := NULL;
    ELSIF response_status IS NULL THEN
        outcome := 'in_flight';
    ELSE
        outcome := 'replay';
    END IF;
END
$$;
