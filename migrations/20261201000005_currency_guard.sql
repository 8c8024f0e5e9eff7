-- One currency per transfer. A wallet's currency is the deployment's
-- `currency` setting when it was created, so changing that setting leaves
-- wallets of two currencies side by side; minor units must never move 1:1
-- between them. The row guard, which already locks both wallets, now also
-- compares their currencies:
--   'currency_mismatch'  the wallets hold different currencies; nothing written.
-- transfer() stores that refusal with the key, like insufficient funds.
CREATE OR REPLACE FUNCTION row_guard_transfer(
    p_transfer_id uuid,
    p_user uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_key uuid,
    p_wait_ms int,
    OUT outcome text,
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
    outcome := 'applied';
END
$$;

-- transfer() as before, with the currency refusal's body passed in like the
-- other two refusals' and stored with the claim.
DROP FUNCTION transfer(uuid, bytea, uuid, bytea, int, int, int, uuid, uuid, uuid, bigint, text, text);
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
