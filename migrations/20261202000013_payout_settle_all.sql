-- The dispatcher settles the payouts of one batch the gateway sent in one
-- transaction. Every settlement updates the same two clearing wallets
-- (holds and gateway), so settled one transaction each, a batch waits for
-- one commit after another on those rows. Each payout is settled exactly
-- as payout_settle() settles it, and answers as it would.
--
-- Every payout row is locked first, in one order, before any wallet: a
-- batch and anything else that settles or releases these payouts (another
-- dispatcher whose lease ran out, reconcile) lock a payout and then the
-- wallets, so they cannot wait on each other in a cycle.
CREATE FUNCTION payout_settle_all(
    p_payout_ids uuid[],
    p_settle_transfer_ids uuid[],
    p_gateway_references text[]
)
RETURNS TABLE (settled_payout_id uuid, recorded payout_record)
LANGUAGE plpgsql AS $$
DECLARE
    v_settling record;
BEGIN
    IF cardinality(p_payout_ids) <> cardinality(p_settle_transfer_ids)
       OR cardinality(p_payout_ids) <> cardinality(p_gateway_references) THEN
        RAISE EXCEPTION 'payout_settle_all: % payouts, % transfer ids, % references',
            cardinality(p_payout_ids), cardinality(p_settle_transfer_ids), cardinality(p_gateway_references);
    END IF;
    PERFORM 1 FROM payouts p WHERE p.id = ANY (p_payout_ids) ORDER BY p.id FOR UPDATE;
    FOR v_settling IN
        SELECT b.payout_id, b.transfer_id, b.reference
          FROM unnest(p_payout_ids, p_settle_transfer_ids, p_gateway_references) AS b (payout_id, transfer_id, reference)
    LOOP
        settled_payout_id := v_settling.payout_id;
        SELECT s.recorded INTO recorded
          FROM payout_settle(v_settling.payout_id, v_settling.transfer_id, v_settling.reference) AS s;
        RETURN NEXT;
    END LOOP;
END
$$;
