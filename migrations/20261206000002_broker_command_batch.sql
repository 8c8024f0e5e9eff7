-- broker_command_batch(), the last function here: many broker commands in
-- one call, the entries a consumer read together from one partition, each
-- decided exactly as broker_command() decides it (its own inbox claim,
-- refusal and stored outcome), in one transaction, so that a batch costs
-- one round trip. backend/src/command/batch.rs calls it. Inputs are parallel arrays, one element per command, in the order
-- the partition delivered them; each row out is one command's answer, by
-- its index (1-based), in broker_command()'s columns (claim, verdict,
-- owner, result), plus `failure`: the SQLSTATE of an error that undid that
-- command alone.
--
-- Locks are taken in one global order across the whole batch, as
-- transfer_batch() takes them (20261202000005_transfer.sql):
--   1. the inbox claims, in command-id order (a broker_command() claims
--      its one command before any wallet);
--   2. every wallet the batch will touch, locked at once in wallet-id
--      order (row_guard_transfer() locks its two in that order too);
--   3. then each command's row guard and stored outcome, in delivery
--      order; its wallets are already held;
--   4. a command the batch leaves to the caller gives back its claim.
-- A transaction waiting on a claim holds no wallet, and one holding
-- wallets waits for no claim, so batches of different partitions, single
-- commands and client transfers never deadlock. Each command's decision
-- runs in a block of its own: one command's error rolls back only that
-- command. A claim that raises, or a wallet lock that waits past
-- p_wallet_wait_ms, fails the call as a whole, and nothing of it is
-- written; the caller then applies the commands one by one.
--
-- Order: a partition's commands apply in the order they were published,
-- and one that cannot be decided yet is retried before anything behind it
-- moves. So the batch stops at the first command without an outcome (its
-- claim found the command in flight elsewhere, or it failed): that one
-- answers why, and every command after it answers nothing at all (claim,
-- verdict and failure NULL), nothing of it written, its claim given back.
-- The caller applies those one by one.
--
-- The same command id twice in one batch (a broker publishing again): the
-- later one is decided after the earlier, by its own claim, which then
-- reads the earlier one's stored outcome (replayed, or payload_changed).
--
-- Subtransactions: each command opens at most two that write, its claim's
-- (claim_first()'s block) and its decision's (step 3's block), and a
-- committed one stays in the transaction's cache of 64 until the call
-- ends; past that cache every snapshot taken anywhere in the database
-- slows down. So a call carries at most 32 commands:
-- `commands_apply_batch_max`. The decision of one claimed command is
-- broker_command()'s own helpers (20261202000012_broker_commands.sql):
-- command_source_owner(), broker_command_refusal(), broker_command_decide().
CREATE FUNCTION broker_command_batch(
    p_command_ids text[],
    p_fingerprints bytea[],
    p_issuers text[],
    p_froms uuid[],
    p_tos uuid[],
    p_amounts bigint[],
    p_published_ats timestamptz[],
    p_dead_letter_reasons text[],
    p_transfer_ids uuid[],
    p_age_hours_max int,
    p_future_s int,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int
)
RETURNS TABLE (idx int, claim inbox_claim_verdict, verdict text, owner uuid, result text, failure text)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_n int := coalesce(array_length(p_command_ids, 1), 0);
    v_claims inbox_claim_verdict[];
    v_verdicts text[];
    v_owners uuid[];
    v_results text[];
    v_failures text[];
    -- Claimed here, and decided by the row guard rather than before it.
    v_guarded boolean[];
    -- The earlier index of the same command id in this batch, if any.
    v_earlier int[];
    -- The first command without an outcome: it and every one after it
    -- are left to the caller.
    v_stop int := v_n + 1;
    v_previous int;
    v_claim record;
    v_decided record;
    v_i int;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_claims := array_fill(NULL::inbox_claim_verdict, ARRAY[v_n]);
    v_verdicts := array_fill(NULL::text, ARRAY[v_n]);
    v_owners := array_fill(NULL::uuid, ARRAY[v_n]);
    v_results := array_fill(NULL::text, ARRAY[v_n]);
    v_failures := array_fill(NULL::text, ARRAY[v_n]);
    v_guarded := array_fill(false, ARRAY[v_n]);
    v_earlier := array_fill(NULL::int, ARRAY[v_n]);

    -- 1. The claims, in command-id order, and the refusals that need no
    -- wallet locked.
    FOR v_i IN
        SELECT i FROM generate_subscripts(p_command_ids, 1) AS i ORDER BY p_command_ids[i], i
    LOOP
        v_owners[v_i] := command_source_owner(p_froms[v_i]);
        IF v_previous IS NOT NULL AND p_command_ids[v_previous] = p_command_ids[v_i] THEN
            v_earlier[v_i] := v_previous;
            v_previous := v_i;
            CONTINUE;
        END IF;
        v_previous := v_i;
        -- No block of its own: a claim that raises (rather than answering
        -- in_flight) fails the call as a whole, and the caller applies the
        -- batch one by one, where it fails alone.
        SELECT * INTO v_claim
          FROM inbox_claim('broker', p_command_ids[v_i], p_fingerprints[v_i], p_retention_hours, p_claim_wait_ms);
        v_claims[v_i] := v_claim.outcome;
        IF v_claim.outcome <> 'started' THEN
            v_verdicts[v_i] := v_claim.verdict;
            v_results[v_i] := v_claim.response_body;
        ELSE
            v_verdicts[v_i] := broker_command_refusal(
                p_published_ats[v_i], p_dead_letter_reasons[v_i], p_age_hours_max, p_future_s,
                v_owners[v_i], p_tos[v_i])::text;
            v_guarded[v_i] := v_verdicts[v_i] IS NULL;
        END IF;
        IF v_claims[v_i] = 'in_flight' THEN
            v_stop := least(v_stop, v_i);
        END IF;
    END LOOP;

    -- 2. Every wallet of the commands the row guard decides, at once, in
    -- id order.
    PERFORM set_config('lock_timeout', p_wallet_wait_ms || 'ms', true);
    -- One array of ids, looked up by key, as transfer_batch() does.
    PERFORM 1 FROM wallets w
      WHERE w.id = ANY (ARRAY(SELECT unnest(ARRAY[p_froms[i], p_tos[i]])
                                FROM generate_subscripts(p_command_ids, 1) AS i WHERE v_guarded[i] AND i < v_stop))
      ORDER BY w.id
        FOR NO KEY UPDATE;

    -- 3. Each command's decision and stored outcome, in delivery order, up
    -- to the first without an outcome.
    FOR v_i IN 1 .. v_n LOOP
        EXIT WHEN v_i >= v_stop;
        CONTINUE WHEN v_claims[v_i] IS DISTINCT FROM 'started' AND v_earlier[v_i] IS NULL;
        BEGIN
            IF v_earlier[v_i] IS NOT NULL THEN
                -- The earlier one's outcome is stored by now, in this
                -- transaction: this claim reads it.
                SELECT * INTO v_claim
                  FROM inbox_claim('broker', p_command_ids[v_i], p_fingerprints[v_i], p_retention_hours,
                                   p_claim_wait_ms);
                IF v_claim.outcome NOT IN ('replayed', 'payload_changed') THEN
                    RAISE EXCEPTION 'a command id repeated in a batch was claimed %', v_claim.outcome;
                END IF;
                v_claims[v_i] := v_claim.outcome;
                v_verdicts[v_i] := v_claim.verdict;
                v_results[v_i] := v_claim.response_body;
            ELSE
                SELECT * INTO v_decided
                  FROM broker_command_decide(
                    p_command_ids[v_i], p_issuers[v_i], p_froms[v_i], p_tos[v_i], p_amounts[v_i],
                    p_dead_letter_reasons[v_i], p_transfer_ids[v_i], v_owners[v_i],
                    v_verdicts[v_i]::command_verdict, p_wallet_wait_ms);
                v_verdicts[v_i] := v_decided.verdict;
                v_results[v_i] := v_decided.result;
            END IF;
        EXCEPTION WHEN OTHERS THEN
            -- This command's guard and outcome were undone; step 4 gives
            -- back its claim.
            v_failures[v_i] := SQLSTATE;
            v_stop := v_i;
        END;
    END LOOP;

    -- 4. What is left to the caller: every command behind the stop, and
    -- the stop itself when it failed, answers nothing but its failure,
    -- and a claim made in step 1 goes, so that applied alone it runs
    -- afresh. A stop in flight elsewhere keeps its answer.
    FOR v_i IN v_stop .. v_n LOOP
        CONTINUE WHEN v_i = v_stop AND v_failures[v_i] IS NULL;
        IF v_claims[v_i] = 'started' THEN
            DELETE FROM inbox i WHERE i.source = 'broker' AND i.event_id = p_command_ids[v_i];
        END IF;
        v_claims[v_i] := NULL;
        v_verdicts[v_i] := NULL;
        v_results[v_i] := NULL;
    END LOOP;

    RETURN QUERY
        SELECT i, v_claims[i], v_verdicts[i], v_owners[i], v_results[i], v_failures[i]
          FROM generate_subscripts(p_command_ids, 1) AS i ORDER BY i;
END
$$;
