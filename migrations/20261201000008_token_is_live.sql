-- Token liveness, in one definition: the token's hash is stored (not
-- revoked), for this user, and not expired. The server's authentication of
-- reads (auth::token_is_live), the statement-by-statement transfer path and
-- transfer() below all ask this function.
CREATE FUNCTION token_is_live(p_token_hash bytea, p_user uuid)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM api_tokens t
        WHERE t.token_hash = p_token_hash AND t.user_id = p_user AND t.expires_at > now()
    )
$$;

-- transfer() as in 20261201000005, asking token_is_live() instead of
-- restating it.
CREATE OR REPLACE FUNCTION transfer(
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
    p_currency_mismatch_body text,
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
    IF NOT token_is_live(p_token_hash, p_user) THEN
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
    ELSIF v_guard.outcome = 'currency_mismatch' THEN
        outcome := 'currency_mismatch';
        response_status := 422;
        response_body := p_currency_mismatch_body;
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
