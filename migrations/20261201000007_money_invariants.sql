-- The money invariants, in one definition for every checker: the test kit
-- after each concurrency test, the chaos suite, the load test after each
-- scenario. For the wallets of `scope` (users), or every wallet when NULL:
--
--   money_created_minor   balances minus opening balances: 0 when no money
--                         was created or destroyed;
--   negative_balances     wallets below zero;
--   unexplained_balances  wallets whose balance is not their opening
--                         balance plus their ledger entries;
--   unbalanced_transfers  transfers (initiated by `scope`) not recorded as
--                         exactly two ledger entries that sum to zero.
--
-- Read-only, and safe to call on a live database.
CREATE FUNCTION money_invariants(scope uuid[] DEFAULT NULL)
RETURNS TABLE (
    money_created_minor  bigint,
    negative_balances    bigint,
    unexplained_balances bigint,
    unbalanced_transfers bigint
)
LANGUAGE sql STABLE AS $$
    WITH w AS (
        SELECT id, opening_balance_minor, balance_minor
        FROM wallets
        WHERE scope IS NULL OR user_id = ANY (scope)
    ),
    t AS (
        SELECT id FROM transfers WHERE scope IS NULL OR initiated_by = ANY (scope)
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
