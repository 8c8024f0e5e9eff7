-- The body of a 201, in one format whichever path made the transfer (this
-- function, or the statement-by-statement demonstration path).
CREATE FUNCTION transfer_receipt(
    p_transfer_id uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_created_at timestamptz,
    p_balance_minor_after bigint
)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format(
        '{"id":"%s","from_wallet_id":"%s","to_wallet_id":"%s","amount_minor":%s,"created_at":"%s","balance_minor_after":%s}',
        p_transfer_id, p_from, p_to, p_amount,
        to_char(p_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        p_balance_minor_after)
$$;

-- The whole transfer transaction in one call, so that it costs one round
-- trip: authentication and ownership (read-only, so a refusal writes
-- nothing), then layer 2 (idempotency_claim), then layer 3
-- (row_guard_transfer), then the response stored with the claim. Called as a
-- single statement, it commits or rolls back as a whole.
--
-- The refusal bodies are built by the service and passed in; the receipt is
-- built here (transfer_receipt()), because it needs the row guard's results.
-- Whatever body is returned is the one stored, so a replay is byte for byte
-- the original.
--
-- outcome: 'unauthorized', 'not_owner', 'replayed', 'mismatch', 'in_flight',
-- 'accepted', 'insufficient_funds' or 'unknown_target'. Each layer's own
-- answer comes back too (claim_outcome; guard_outcome with the balance and
-- time of an applied transfer), with claim_ms and guard_ms, its time inside
-- the database, for traces and metrics.
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
    p_insufficient_funds_body text,
    p_unknown_target_body text,
    OUT outcome text,
    OUT response_status smallint,
    OUT response_body text,
    OUT claim_outcome text,
    OUT claim_ms double precision,
    OUT guard_outcome text,
    OUT guard_ms double precision,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_guard record;
    v_started timestamptz;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM api_tokens t
                    WHERE t.token_hash = p_token_hash AND t.user_id = p_user AND t.expires_at > now()) THEN
        outcome := 'unauthorized';
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM wallets w WHERE w.id = p_from AND w.user_id = p_user) THEN
        outcome := 'not_owner';
        RETURN;
    END IF;

    -- Layer 2: the idempotency claim.
    IF p_key IS NOT NULL THEN
        v_started := clock_timestamp();
        SELECT * INTO v_claim
          FROM idempotency_claim(p_user, p_key, p_fingerprint, p_retention_hours, p_claim_wait_ms);
        claim_outcome := v_claim.outcome;
        claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
        IF v_claim.outcome = 'replay' THEN
            outcome := 'replayed';
            response_status := v_claim.response_status;
            response_body := v_claim.response_body;
            RETURN;
        ELSIF v_claim.outcome <> 'started' THEN
            outcome := v_claim.outcome;
            RETURN;
        END IF;
    END IF;

    -- Layer 3: the row guard.
    v_started := clock_timestamp();
    SELECT * INTO v_guard
      FROM row_guard_transfer(p_transfer_id, p_user, p_from, p_to, p_amount, p_key, p_wallet_wait_ms);
    guard_outcome := v_guard.outcome;
    guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    balance_minor_after := v_guard.balance_minor_after;
    created_at := v_guard.created_at;
    IF v_guard.outcome = 'applied' THEN
        outcome := 'accepted';
        response_status := 201;
        response_body := transfer_receipt(
            p_transfer_id, p_from, p_to, p_amount, v_guard.created_at, v_guard.balance_minor_after);
    ELSIF v_guard.outcome = 'insufficient_funds' THEN
        outcome := 'insufficient_funds';
        response_status := 422;
        response_body := p_insufficient_funds_body;
    ELSIF v_guard.outcome = 'unknown_target' THEN
        outcome := 'unknown_target';
        response_status := 422;
        response_body := p_unknown_target_body;
    ELSE
        -- Ownership was checked above and never changes.
        RAISE EXCEPTION 'row guard refused an owner: %', v_guard.outcome;
    END IF;

    IF p_key IS NOT NULL THEN
        UPDATE idempotency_keys k
           SET response_status = response_status,
               response_body = response_body,
               transfer_id = CASE WHEN outcome = 'accepted' THEN p_transfer_id END
         WHERE k.user_id = p_user AND k.key = p_key;
    END IF;
END
$$;
