-- The money invariants, in one definition for every checker: the test kit
-- after each concurrency test, the chaos suite, the load test after each
-- scenario, the race lab after each run. For one set of wallets:
--
--   money_created_minor   balances minus opening balances, less what
--                         moved between the set and clearing wallets
--                         outside it (a deposit brings money in and a
--                         payout's hold takes it out; neither creates or
--                         destroys it): 0 when no money was created or
--                         destroyed;
--   negative_balances     wallets below zero (the provider's clearing
--                         wallet is below zero by what it paid in, by
--                         design);
--   unexplained_balances  wallets whose balance is not their opening
--                         balance plus their ledger entries (a lost update);
--   unbalanced_transfers  transfers out of the set not recorded as exactly
--                         two ledger entries that sum to zero;
--   unbalanced_payouts    payouts from the set whose transfers do not match
--                         their state: a hold from the wallet to the holds
--                         wallet, then, once settled, one from the holds
--                         to the gateway's wallet, or, once failed, one
--                         back to the wallet, each of the payout's amount;
--   unexplained_payout_accounts
--                         holds wallets whose balance is not the sum of
--                         the payouts still held, and gateway wallets
--                         whose balance is not the sum of those settled
--                         (the whole deployment's, whatever the set), and
--                         lab payouts' holds wallets in the set whose
--                         balance is not their lab payouts still held.
--
-- Read-only, and safe to call on a live database.
CREATE FUNCTION wallet_set_invariants(p_wallets uuid[])
RETURNS TABLE (
    money_created_minor         bigint,
    negative_balances           bigint,
    unexplained_balances        bigint,
    unbalanced_transfers        bigint,
    unbalanced_payouts          bigint,
    unexplained_payout_accounts bigint
)
LANGUAGE sql STABLE AS $$
    WITH w AS (
        SELECT id, opening_balance_minor, balance_minor, clearing_source FROM wallets WHERE id = ANY (p_wallets)
    ),
    t AS (
        SELECT id FROM transfers WHERE from_wallet_id = ANY (p_wallets)
    ),
    p AS (
        SELECT * FROM payouts WHERE wallet_id = ANY (p_wallets)
    )
    SELECT
        ((SELECT coalesce(sum(balance_minor - opening_balance_minor), 0) FROM w)
         - (SELECT coalesce(sum(l.amount_minor), 0)
              FROM ledger_entries l
              JOIN transfers d ON d.id = l.transfer_id
              JOIN wallets c
                ON c.id = CASE WHEN d.from_wallet_id = l.wallet_id THEN d.to_wallet_id ELSE d.from_wallet_id END
             WHERE l.wallet_id = ANY (p_wallets)
               AND c.clearing_source IS NOT NULL
               AND NOT (c.id = ANY (p_wallets))))::bigint,
        (SELECT count(*) FROM w WHERE balance_minor < 0 AND clearing_source IS DISTINCT FROM 'provider'),
        (SELECT count(*) FROM w
         WHERE balance_minor <> opening_balance_minor
             + coalesce((SELECT sum(amount_minor) FROM ledger_entries l WHERE l.wallet_id = w.id), 0)),
        (SELECT count(*) FROM t
         WHERE (SELECT count(*) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 2
            OR (SELECT coalesce(sum(amount_minor), 0) FROM ledger_entries l WHERE l.transfer_id = t.id) <> 0),
        (SELECT count(*) FROM p
         WHERE NOT EXISTS (
                   SELECT 1 FROM transfers h
                    WHERE h.id = p.hold_transfer_id AND h.from_wallet_id = p.wallet_id
                      AND h.to_wallet_id = payout_wallet('holds', p.user_id, p.currency)
                      AND h.amount_minor = p.amount_minor)
            OR (p.state = 'settled') <> EXISTS (
                   SELECT 1 FROM transfers s
                    WHERE s.id = p.settle_transfer_id
                      AND s.from_wallet_id = payout_wallet('holds', p.user_id, p.currency)
                      AND s.to_wallet_id = payout_wallet('gateway', p.user_id, p.currency)
                      AND s.amount_minor = p.amount_minor)
            OR (p.state = 'failed') <> EXISTS (
                   SELECT 1 FROM transfers r
                    WHERE r.id = p.release_transfer_id
                      AND r.from_wallet_id = payout_wallet('holds', p.user_id, p.currency)
                      AND r.to_wallet_id = p.wallet_id AND r.amount_minor = p.amount_minor)),
        (SELECT count(*) FROM wallets c
         WHERE (c.clearing_source = 'holds' AND c.balance_minor <> coalesce(
                   (SELECT sum(amount_minor) FROM payouts
                     WHERE currency = c.currency AND payout_holds(state)), 0))
            OR (c.clearing_source = 'gateway' AND c.balance_minor <> coalesce(
                   (SELECT sum(amount_minor) FROM payouts WHERE currency = c.currency AND state = 'settled'), 0))
            -- A lab payouts' holds wallet in the set holds its visitor's
            -- lab payouts still held.
            OR (c.lab_slot = 3 AND c.id = ANY (p_wallets) AND c.balance_minor <> coalesce(
                   (SELECT sum(amount_minor) FROM payouts
                     WHERE user_id = c.user_id AND currency = 'LAB' AND payout_holds(state)), 0)))
$$;

-- The deployment's own check: real money only (lab wallets are left out,
-- so that a lab run with a layer switched off cannot make it fail), for
-- the wallets of the users in `scope`, or every real wallet when NULL
-- (clearing wallets included, so that what providers paid in and what
-- wallets received cancel out, and so do holds, settlements and releases).
CREATE FUNCTION money_invariants(scope uuid[] DEFAULT NULL)
RETURNS TABLE (
    money_created_minor         bigint,
    negative_balances           bigint,
    unexplained_balances        bigint,
    unbalanced_transfers        bigint,
    unbalanced_payouts          bigint,
    unexplained_payout_accounts bigint
)
LANGUAGE sql STABLE AS $$
    SELECT * FROM wallet_set_invariants(ARRAY(
        SELECT id FROM wallets WHERE lab_slot IS NULL AND (scope IS NULL OR user_id = ANY (scope))))
$$;
