-- Layer 3, the row guard: backend/src/defense/row_guard.rs documents the
-- layer; this is its SQL. It comes before layer 2's file because a stored
-- response (idempotency_keys.response_refusal) is one of its answers.
--
-- Each answer is a value of guard_verdict, decoded one to one into the
-- Rust enum row_guard::GuardVerdict; a value one side does not know fails
-- to decode, it is never guessed at.
CREATE TYPE guard_verdict AS ENUM (
    'accepted', 'insufficient_funds', 'unknown_target', 'currency_mismatch', 'not_owner');

-- The race lab's sandbox is not the guard's concern: which wallets a
-- caller may name at all is checked with access, before the layers
-- (wallet_out_of_reach(), 20261202000005_transfer.sql).
--
-- Both wallets are locked in wallet-id order (transfers A->B and B->A take
-- their locks in the same order, so they cannot deadlock), waiting at most
-- p_wait_ms; then the guarded debit checks and writes in one statement,
-- and the credit, the transfer and its two ledger entries follow:
--   'accepted'           debited, credited, recorded;
--   'insufficient_funds' the guard refused the debit; nothing written;
--   'unknown_target'     no such target wallet, or a clearing wallet;
--                        nothing written;
--   'currency_mismatch'  the wallets hold different currencies (minor units
--                        never move 1:1 between them); nothing written;
--   'not_owner'          the caller does not own the source wallet.
CREATE FUNCTION row_guard_transfer(
    p_transfer_id uuid,
    p_user uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_key uuid,
    p_wait_ms int,
    OUT outcome guard_verdict,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_source_owner uuid;
    v_source_currency text;
    v_target_currency text;
    v_target_clearing boolean;
    v_wallet record;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    FOR v_wallet IN
        SELECT w.id, w.user_id, w.currency, w.clearing_source FROM wallets w
         WHERE w.id IN (p_from, p_to)
         ORDER BY w.id
           FOR NO KEY UPDATE
    LOOP
        IF v_wallet.id = p_from THEN
            v_source_owner := v_wallet.user_id;
            v_source_currency := v_wallet.currency;
        ELSE
            v_target_currency := v_wallet.currency;
            v_target_clearing := v_wallet.clearing_source IS NOT NULL;
        END IF;
    END LOOP;
    IF v_source_owner IS DISTINCT FROM p_user THEN
        outcome := 'not_owner';
        RETURN;
    END IF;
    -- Money goes back to a provider only as a payout, never as a transfer
    -- into its clearing wallet.
    IF v_target_currency IS NULL OR v_target_clearing THEN
        outcome := 'unknown_target';
        RETURN;
    END IF;
    IF v_target_currency <> v_source_currency THEN
        outcome := 'currency_mismatch';
        RETURN;
    END IF;

    -- The guard: check and write in one statement.
    UPDATE wallets SET balance_minor = balance_minor - p_amount, version = version + 1
     WHERE id = p_from AND balance_minor >= p_amount
    RETURNING balance_minor INTO balance_minor_after;
    IF NOT FOUND THEN
        outcome := 'insufficient_funds';
        RETURN;
    END IF;

    UPDATE wallets SET balance_minor = balance_minor + p_amount, version = version + 1 WHERE id = p_to;
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, idempotency_key)
    VALUES (p_transfer_id, p_from, p_to, p_amount, p_user, p_key)
    RETURNING transfers.created_at INTO created_at;
    -- Double entry: the pair sums to zero.
    INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
    VALUES (p_transfer_id, p_from, -p_amount), (p_transfer_id, p_to, p_amount);
    outcome := 'accepted';
END
$$;
