-- The race lab's sandbox: two wallets per visitor holding lab money (see
-- wallets.lab_slot in 20261202000002_wallets_and_ledger.sql).

-- Makes a visitor's two lab wallets on first use, then empties them for a
-- new run: their transfers, ledger entries, the keys that point at those
-- transfers and the lab's deposit events go, and both balances start again at p_balance_minor.
-- Only lab rows are touched: every statement filters on lab_slot. The
-- wallets are locked first, so a run started from a second tab waits for
-- this reset instead of interleaving with it.
CREATE FUNCTION race_lab_reset(p_user uuid, p_balance_minor bigint, OUT wallet_a uuid, OUT wallet_b uuid)
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor, lab_slot)
    SELECT gen_random_uuid(), p_user, 'LAB', p_balance_minor, p_balance_minor, slot
      FROM (VALUES (1::smallint), (2::smallint)) AS slots (slot)
    ON CONFLICT (user_id, lab_slot) WHERE lab_slot IS NOT NULL DO NOTHING;

    SELECT (array_agg(id) FILTER (WHERE lab_slot = 1))[1], (array_agg(id) FILTER (WHERE lab_slot = 2))[1]
      INTO wallet_a, wallet_b
      FROM (SELECT id, lab_slot FROM wallets
             WHERE user_id = p_user AND lab_slot IS NOT NULL
             ORDER BY id FOR UPDATE) AS locked;

    DELETE FROM idempotency_keys k
     USING transfers t
     WHERE k.transfer_id = t.id AND t.from_wallet_id IN (wallet_a, wallet_b);
    -- The lab's deposit events, named 'lab:<visitor>:<event>'.
    DELETE FROM inbox WHERE source = 'race_lab' AND event_id LIKE 'lab:' || p_user::text || ':%';
    DELETE FROM ledger_entries WHERE wallet_id IN (wallet_a, wallet_b);
    DELETE FROM transfers WHERE from_wallet_id IN (wallet_a, wallet_b);
    UPDATE wallets
       SET opening_balance_minor = p_balance_minor, balance_minor = p_balance_minor
     WHERE id IN (wallet_a, wallet_b) AND lab_slot IS NOT NULL;
END
$$;

-- A visitor's lab wallets after a run, checked against the database.
CREATE FUNCTION race_lab_state(p_user uuid)
RETURNS TABLE (
    wallet_a_balance_minor bigint,
    wallet_b_balance_minor bigint,
    moved_minor            bigint,
    transfers              bigint,
    money_created_minor    bigint,
    negative_balances      bigint,
    unexplained_balances   bigint,
    unbalanced_transfers   bigint
)
LANGUAGE sql STABLE AS $$
    WITH lab AS (
        SELECT array_agg(id) AS ids,
               min(balance_minor) FILTER (WHERE lab_slot = 1) AS a,
               min(balance_minor) FILTER (WHERE lab_slot = 2) AS b
          FROM wallets WHERE user_id = p_user AND lab_slot IS NOT NULL
    )
    SELECT lab.a, lab.b,
           (SELECT coalesce(sum(amount_minor), 0) FROM transfers WHERE from_wallet_id = ANY (lab.ids))::bigint,
           (SELECT count(*) FROM transfers WHERE from_wallet_id = ANY (lab.ids)),
           i.money_created_minor, i.negative_balances, i.unexplained_balances, i.unbalanced_transfers
      FROM lab, wallet_set_invariants(lab.ids) AS i
$$;
