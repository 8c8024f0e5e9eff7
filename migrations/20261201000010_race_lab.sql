-- The race lab's sandbox: two wallets per visitor holding lab money.
--
-- A lab wallet is marked by its slot (1 or 2; NULL for a real wallet) and
-- holds the currency LAB, which no deployment may use for real money. The
-- row guard already refuses to move minor units between currencies, on the
-- guarded and on the naive path, so lab money and real money never meet:
-- the boundary is the currency guard, enforced where the money moves.
ALTER TABLE wallets
    ADD COLUMN lab_slot smallint CHECK (lab_slot IN (1, 2)),
    ADD CONSTRAINT wallets_lab_money CHECK ((lab_slot IS NOT NULL) = (currency = 'LAB'));
CREATE UNIQUE INDEX wallets_lab_slot_idx ON wallets (user_id, lab_slot) WHERE lab_slot IS NOT NULL;

-- Makes a visitor's two lab wallets on first use, then empties them for a
-- new run: their transfers, ledger entries and the keys that point at
-- those transfers go, and both balances start again at p_balance_minor.
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
    DELETE FROM ledger_entries WHERE wallet_id IN (wallet_a, wallet_b);
    DELETE FROM transfers WHERE from_wallet_id IN (wallet_a, wallet_b);
    UPDATE wallets
       SET opening_balance_minor = p_balance_minor, balance_minor = p_balance_minor
     WHERE id IN (wallet_a, wallet_b) AND lab_slot IS NOT NULL;
END
$$;

-- The money invariants of one set of wallets (see 20261201000007): money
-- created (balances minus opening balances), negative balances, balances
-- their ledger does not explain, and transfers out of the set that are not
-- exactly two ledger entries summing to zero. One definition for the real
-- money check and the race lab's.
CREATE FUNCTION wallet_set_invariants(p_wallets uuid[])
RETURNS TABLE (
    money_created_minor  bigint,
    negative_balances    bigint,
    unexplained_balances bigint,
    unbalanced_transfers bigint
)
LANGUAGE sql STABLE AS $$
    WITH w AS (
        SELECT id, opening_balance_minor, balance_minor FROM wallets WHERE id = ANY (p_wallets)
    ),
    t AS (
        SELECT id FROM transfers WHERE from_wallet_id = ANY (p_wallets)
    )
    SELECT
        (SELECT coalesce(sum(balance_minor - opening_balance_minor), 0) FROM w)::bigint,
        (SELECT count(*) FROM w WHERE balance_minor < 0),
        (SELECT count(*) FROM w
         WHERE balance_minor <> opening_balance_minor
             + coalesce((SELECT sum(amount_minor) FROM ledger_entries l WHERE l.wallet_id = w.id), 0)),
        (SELECT count(*) FROM t
         WHERE (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 2
            OR (SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 0)
$$;

-- From now on money_invariants() covers real money only, so that a lab run
-- with a layer switched off cannot make the deployment's own check fail.
-- Same signature and columns as before.
CREATE OR REPLACE FUNCTION money_invariants(scope uuid[] DEFAULT NULL)
RETURNS TABLE (
    money_created_minor  bigint,
    negative_balances    bigint,
    unexplained_balances bigint,
    unbalanced_transfers bigint
)
LANGUAGE sql STABLE AS $$
    SELECT * FROM wallet_set_invariants(ARRAY(
        SELECT id FROM wallets WHERE lab_slot IS NULL AND (scope IS NULL OR user_id = ANY (scope))))
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
           i.*
      FROM lab, wallet_set_invariants(lab.ids) AS i
$$;
