-- The gateway sent them: each hold becomes a posted debit, moved from the
-- holds wallet to the gateway's clearing wallet, and each outbox row goes.
-- Whoever asked the gateway (the lease holder, a holder whose lease ran
-- out, reconcile) may record a payout; its row's lock makes it once.
--
-- One settlement rule for one payout or a batch: payout_settle() is a
-- batch of one. The dispatcher settles what came back together in one
-- call, set-based, because every settlement moves money between the same
-- two clearing wallets:
--
--   - every payout row is locked first, in id order, before any wallet:
--     a batch and anything else that settles or releases these payouts
--     lock a payout and then the wallets, so they cannot wait on each
--     other in a cycle;
--   - each clearing wallet is updated once, by the batch's sum, and last
--     (holds, then gateway): the rows every dispatcher shares stay locked
--     from that update to the commit only, so several batches' work runs
--     side by side and only their commits queue.
--
-- Each payout answers 'done' (settled now), 'already' (settled before, or
-- earlier in this batch) or 'contradicted' (released before: nothing
-- written, a person must look).
CREATE FUNCTION payout_settle_all(
    p_payout_ids uuid[],
    p_settle_transfer_ids uuid[],
    p_gateway_references text[]
)
RETURNS TABLE (settled_payout_id uuid, recorded payout_record, owner uuid)
LANGUAGE plpgsql AS $$
DECLARE
    v_asked bigint;
    v_found bigint;
    v_wallets uuid[];
    v_deltas bigint[];
    v_move int;
BEGIN
    IF cardinality(p_payout_ids) <> cardinality(p_settle_transfer_ids)
       OR cardinality(p_payout_ids) <> cardinality(p_gateway_references) THEN
        RAISE EXCEPTION 'payout_settle_all: % payouts, % transfer ids, % references',
            cardinality(p_payout_ids), cardinality(p_settle_transfer_ids), cardinality(p_gateway_references);
    END IF;
    SELECT count(DISTINCT id) INTO v_asked FROM unnest(p_payout_ids) AS b (id);
    PERFORM 1 FROM payouts p WHERE p.id = ANY (p_payout_ids) ORDER BY p.id FOR UPDATE;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found <> v_asked THEN
        RAISE EXCEPTION 'payout_settle_all: % of the payouts do not exist', v_asked - v_found;
    END IF;

    -- The answers, decided on the rows as they were before this call.
    RETURN QUERY
        SELECT b.payout_id,
               CASE
                   WHEN p.state = 'settled' OR b.copy > 1 THEN 'already'
                   WHEN p.state = 'failed' THEN 'contradicted'
                   ELSE 'done'
               END::payout_record,
               p.user_id
          FROM (SELECT u.payout_id, u.place,
                       row_number() OVER (PARTITION BY u.payout_id ORDER BY u.place) AS copy
                  FROM unnest(p_payout_ids) WITH ORDINALITY AS u (payout_id, place)) AS b
          JOIN payouts p ON p.id = b.payout_id
         ORDER BY b.place;

    WITH settling AS (
        SELECT DISTINCT ON (b.payout_id)
               b.payout_id, b.transfer_id, b.reference, p.amount_minor, p.user_id,
               payout_wallet('holds', p.user_id, p.currency) AS holds,
               payout_wallet('gateway', p.user_id, p.currency) AS gateway
          FROM unnest(p_payout_ids, p_settle_transfer_ids, p_gateway_references) WITH ORDINALITY
               AS b (payout_id, transfer_id, reference, place)
          JOIN payouts p ON p.id = b.payout_id
         WHERE p.state NOT IN ('settled', 'failed')
         ORDER BY b.payout_id, b.place
    ), transferred AS (
        INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
        SELECT s.transfer_id, s.holds, s.gateway, s.amount_minor, s.user_id FROM settling s
    ), entered AS (
        INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
        SELECT s.transfer_id, s.holds, -s.amount_minor FROM settling s
        UNION ALL
        SELECT s.transfer_id, s.gateway, s.amount_minor FROM settling s
    ), marked AS (
        UPDATE payouts p
           SET state = 'settled', settle_transfer_id = s.transfer_id,
               gateway_reference = left(s.reference, 128), updated_at = now()
          FROM settling s
         WHERE p.id = s.payout_id
    ), gone AS (
        DELETE FROM payout_outbox o USING settling s WHERE o.payout_id = s.payout_id
    ), moves AS (
        SELECT s.holds AS wallet_id, 1 AS turn, -s.amount_minor AS delta FROM settling s
        UNION ALL
        SELECT s.gateway, 2, s.amount_minor FROM settling s
    )
    SELECT array_agg(m.wallet_id ORDER BY m.turn, m.wallet_id), array_agg(m.delta ORDER BY m.turn, m.wallet_id)
      INTO v_wallets, v_deltas
      FROM (SELECT moves.wallet_id, min(moves.turn) AS turn, sum(moves.delta) AS delta
              FROM moves GROUP BY moves.wallet_id) AS m;

    FOR v_move IN 1 .. coalesce(cardinality(v_wallets), 0) LOOP
        UPDATE wallets SET balance_minor = balance_minor + v_deltas[v_move], version = version + 1
         WHERE id = v_wallets[v_move];
    END LOOP;
END
$$;

-- The gateway sent it: one payout settled as a batch of one.
CREATE FUNCTION payout_settle(
    p_payout_id uuid,
    p_settle_transfer_id uuid,
    p_gateway_reference text,
    OUT recorded payout_record,
    OUT owner uuid
)
LANGUAGE sql AS $$
    SELECT s.recorded, s.owner
      FROM payout_settle_all(ARRAY[p_payout_id], ARRAY[p_settle_transfer_id], ARRAY[p_gateway_reference]) AS s
$$;
