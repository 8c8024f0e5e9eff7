-- The money invariants, in one definition for every checker: the test kit
-- after each concurrency test, the chaos suite, the load test after each
-- scenario, the race lab after each run. For one set of wallets:
--
--   money_created_minor   balances minus opening balances, less what
--                         arrived from a clearing wallet outside the set
--                         (a deposit brings money in; it does not create
--                         it): 0 when no money was created or destroyed;
--   negative_balances     wallets below zero (a clearing wallet is below
--                         zero by what its source paid in, by design);
--   unexplained_balances  wallets whose balance is not their opening
--                         balance plus their ledger entries (a lost update);
--   unbalanced_transfers  transfers out of the set not recorded as exactly
--                         two ledger entries that sum to zero.
--
-- Read-only, and safe to call on a live database.
CREATE FUNCTION wallet_set_invariants(p_wallets uuid[])
RETURNS TABLE (
    money_created_minor  bigint,
    negative_balances    bigint,
    unexplained_balances bigint,
    unbalanced_transfers bigint
)
LANGUAGE sql STABLE AS $$
    WITH w AS (
        SELECT id, opening_balance_minor, balance_minor, clearing_source FROM wallets WHERE id = ANY (p_wallets)
    ),
    t AS (
        SELECT id FROM transfers WHERE from_wallet_id = ANY (p_wallets)
    )
    SELECT
        ((SELECT coalesce(sum(balance_minor - opening_balance_minor), 0) FROM w)
         - (SELECT coalesce(sum(l.amount_minor), 0)
              FROM ledger_entries l
              JOIN transfers d ON d.id = l.transfer_id
              JOIN wallets c ON c.id = d.from_wallet_id
             WHERE l.wallet_id = ANY (p_wallets)
               AND c.clearing_source IS NOT NULL
               AND NOT (c.id = ANY (p_wallets))))::bigint,
        (SELECT count(*) FROM w WHERE balance_minor < 0 AND clearing_source IS NULL),
        (SELECT count(*) FROM w
         WHERE balance_minor <> opening_balance_minor
             + coalesce((SELECT sum(amount_minor) FROM ledger_entries l WHERE l.wallet_id = w.id), 0)),
        (SELECT count(*) FROM t
         WHERE (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 2
            OR (SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 0)
$$;

-- The deployment's own check: real money only (lab wallets are left out,
-- so that a lab run with a layer switched off cannot make it fail), for
-- the wallets of the users in `scope`, or every real wallet when NULL
-- (clearing wallets included, so that what providers paid in and what
-- wallets received cancel out).
CREATE FUNCTION money_invariants(scope uuid[] DEFAULT NULL)
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
