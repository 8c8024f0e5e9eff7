-- The race lab's sandbox: three wallets per visitor holding lab money (see
-- wallets.lab_slot in 20261202000002_wallets_and_ledger.sql): A and B, and
-- the holds wallet of the visitor's lab payouts; and the lab's own bank.

-- The lab's bank: what it sent for each visitor's lab payouts, in its own
-- ledger (backend/src/race_lab/bank.rs). Like a real payment API it sends
-- once per Idempotency-Key and replays its answer to the key's next
-- request; with its deduplication switched off for a run, every request
-- sends. payout_id names the payout the money was for, whether or not the
-- payout still exists here: a payout whose transaction rolled back after
-- the call left no row, and its sending shows money sent without a debit.
CREATE TABLE race_lab_bank_sendings (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    user_id         uuid        NOT NULL REFERENCES users (id),
    idempotency_key text        NOT NULL CHECK (length(idempotency_key) <= 100),
    payout_id       uuid        NOT NULL,
    amount_minor    bigint      NOT NULL CHECK (amount_minor > 0),
    deduplicated    boolean     NOT NULL,
    sent_at         timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX race_lab_bank_keys_idx ON race_lab_bank_sendings (user_id, idempotency_key) WHERE deduplicated;

-- The race lab's take, as the dispatcher's (payout_take()) but of one
-- visitor's lab payouts only: up to p_rows due outbox rows of p_user's lab
-- money that nobody else is taking, each leased (payout_lease()). The lab
-- sends them to its own bank.
CREATE FUNCTION race_lab_payout_take(p_user uuid, p_rows int, p_lease_ms int)
RETURNS SETOF payout_taken
LANGUAGE sql AS $$
    SELECT * FROM payout_lease(ARRAY(
        SELECT o.payout_id FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id
         WHERE o.due_at <= now() AND p.currency = 'LAB' AND p.user_id = p_user
         ORDER BY o.due_at
         LIMIT p_rows
           FOR UPDATE OF o SKIP LOCKED
    ), p_lease_ms)
$$;

-- One request to the lab's bank. Deduplicating, a key it has seen is
-- answered with its first sending (replayed), and refused when that
-- sending was for another payout or amount (other_payout); otherwise it
-- sends.
CREATE FUNCTION race_lab_bank_send(
    p_user uuid,
    p_key text,
    p_payout uuid,
    p_amount bigint,
    p_deduplicates boolean,
    OUT sending bigint,
    OUT replayed boolean,
    OUT other_payout boolean
)
LANGUAGE plpgsql AS $$
BEGIN
    replayed := false;
    other_payout := false;
    INSERT INTO race_lab_bank_sendings (user_id, idempotency_key, payout_id, amount_minor, deduplicated)
    VALUES (p_user, p_key, p_payout, p_amount, p_deduplicates)
    ON CONFLICT (user_id, idempotency_key) WHERE deduplicated DO NOTHING
    RETURNING id INTO sending;
    IF sending IS NULL THEN
        SELECT s.id, s.payout_id <> p_payout OR s.amount_minor <> p_amount
          INTO STRICT sending, other_payout
          FROM race_lab_bank_sendings s
         WHERE s.user_id = p_user AND s.idempotency_key = p_key AND s.deduplicated;
        replayed := true;
    END IF;
END
$$;

-- Makes a visitor's lab wallets on first use, then empties them for a new
-- run: their transfers, ledger entries, payouts and the lab bank's
-- sendings, the keys that point at those transfers and the lab's deposit
-- events go; A and B start again at p_balance_minor, the holds wallet at
-- zero. Only lab rows are touched: every statement filters on lab_slot or
-- on the visitor. The wallets are locked first, so a run started from a
-- second tab waits for this reset instead of interleaving with it.
CREATE FUNCTION race_lab_reset(p_user uuid, p_balance_minor bigint, OUT wallet_a uuid, OUT wallet_b uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_lab uuid[];
BEGIN
    INSERT INTO wallets (id, user_id, currency, opening_balance_minor, balance_minor, lab_slot)
    SELECT gen_random_uuid(), p_user, 'LAB', 0, 0, slot
      FROM (VALUES (1::smallint), (2::smallint), (3::smallint)) AS slots (slot)
    ON CONFLICT (user_id, lab_slot) WHERE lab_slot IS NOT NULL DO NOTHING;

    SELECT array_agg(id), (array_agg(id) FILTER (WHERE lab_slot = 1))[1], (array_agg(id) FILTER (WHERE lab_slot = 2))[1]
      INTO v_lab, wallet_a, wallet_b
      FROM (SELECT id, lab_slot FROM wallets
             WHERE user_id = p_user AND lab_slot IS NOT NULL
             ORDER BY id FOR UPDATE) AS locked;

    DELETE FROM idempotency_keys k
     USING transfers t
     WHERE k.transfer_id = t.id AND t.from_wallet_id = ANY (v_lab);
    -- The lab's deposit events, named 'lab:<visitor>:<event>'.
    DELETE FROM inbox WHERE source = 'race_lab' AND event_id LIKE 'lab:' || p_user::text || ':%';
    DELETE FROM payout_outbox o USING payouts p WHERE o.payout_id = p.id AND p.wallet_id = ANY (v_lab);
    DELETE FROM payouts WHERE wallet_id = ANY (v_lab);
    DELETE FROM race_lab_bank_sendings WHERE user_id = p_user;
    DELETE FROM ledger_entries WHERE wallet_id = ANY (v_lab);
    DELETE FROM transfers WHERE from_wallet_id = ANY (v_lab);
    UPDATE wallets
       SET opening_balance_minor = CASE WHEN lab_slot = 3 THEN 0 ELSE p_balance_minor END,
           balance_minor = CASE WHEN lab_slot = 3 THEN 0 ELSE p_balance_minor END,
           version = version + 1
     WHERE id = ANY (v_lab) AND lab_slot IS NOT NULL;
END
$$;

-- A visitor's lab wallets after a run, checked against the database:
-- what moved between A and B, the money invariants, and for lab payouts
-- what they hold and what the lab's bank sent for them.
--   payouts_settled           lab payouts the bank's answer settled;
--   payouts_debited_minor     what the lab payouts took from A and kept
--                             (held or settled; a failed one gave it back);
--   bank_sendings             money sent by the lab's bank, each time;
--   bank_sent_minor           what it sent in all;
--   orders_paid_twice         payouts the bank sent money for more than once;
--   sent_twice_minor          what the bank sent beyond once per payout;
--   sent_without_a_debit_minor
--                             what the bank sent for payouts that do not
--                             exist here (their transaction rolled back);
--   settled_not_sent_once     settled payouts the bank did not send exactly
--                             once.
CREATE FUNCTION race_lab_state(p_user uuid)
RETURNS TABLE (
    wallet_a_balance_minor      bigint,
    wallet_b_balance_minor      bigint,
    moved_minor                 bigint,
    transfers                   bigint,
    money_created_minor         bigint,
    negative_balances           bigint,
    unexplained_balances        bigint,
    unbalanced_transfers        bigint,
    held_minor                  bigint,
    payouts_settled             bigint,
    payouts_debited_minor       bigint,
    bank_sendings               bigint,
    bank_sent_minor             bigint,
    orders_paid_twice           bigint,
    sent_twice_minor            bigint,
    sent_without_a_debit_minor  bigint,
    settled_not_sent_once       bigint,
    unbalanced_payouts          bigint,
    unexplained_payout_accounts bigint
)
LANGUAGE sql STABLE AS $$
    WITH lab AS (
        SELECT array_agg(id) AS ids,
               array_agg(id) FILTER (WHERE lab_slot IN (1, 2)) AS ab,
               min(balance_minor) FILTER (WHERE lab_slot = 1) AS a,
               min(balance_minor) FILTER (WHERE lab_slot = 2) AS b,
               coalesce(min(balance_minor) FILTER (WHERE lab_slot = 3), 0) AS held
          FROM wallets WHERE user_id = p_user AND lab_slot IS NOT NULL
    ),
    between_ab AS (
        SELECT t.amount_minor FROM transfers t, lab
         WHERE t.from_wallet_id = ANY (lab.ab) AND t.to_wallet_id = ANY (lab.ab)
    ),
    lab_payouts AS (
        SELECT p.* FROM payouts p, lab WHERE p.wallet_id = ANY (lab.ids)
    ),
    sent AS (
        SELECT s.payout_id, count(*) AS times, sum(s.amount_minor) AS minor, min(s.amount_minor) AS once_minor,
               EXISTS (SELECT 1 FROM lab_payouts p WHERE p.id = s.payout_id) AS debited
          FROM race_lab_bank_sendings s WHERE s.user_id = p_user
         GROUP BY s.payout_id
    )
    SELECT lab.a, lab.b,
           (SELECT coalesce(sum(amount_minor), 0) FROM between_ab)::bigint,
           (SELECT count(*) FROM between_ab),
           i.money_created_minor, i.negative_balances, i.unexplained_balances, i.unbalanced_transfers,
           lab.held,
           (SELECT count(*) FROM lab_payouts WHERE state = 'settled'),
           (SELECT coalesce(sum(amount_minor), 0) FROM lab_payouts WHERE state <> 'failed')::bigint,
           (SELECT coalesce(sum(times), 0) FROM sent)::bigint,
           (SELECT coalesce(sum(minor), 0) FROM sent)::bigint,
           (SELECT count(*) FROM sent WHERE debited AND times > 1),
           (SELECT coalesce(sum(minor - once_minor), 0) FROM sent WHERE debited)::bigint,
           (SELECT coalesce(sum(minor), 0) FROM sent WHERE NOT debited)::bigint,
           (SELECT count(*) FROM lab_payouts p
             WHERE p.state = 'settled' AND coalesce((SELECT times FROM sent WHERE sent.payout_id = p.id), 0) <> 1),
           i.unbalanced_payouts, i.unexplained_payout_accounts
      FROM lab, wallet_set_invariants(lab.ids) AS i
$$;
