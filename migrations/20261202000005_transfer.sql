-- The whole transfer transaction in one call, so that it costs one round
-- trip: access (read-only, so a refusal writes nothing), layer 2
-- (idempotency_claim), layer 3 (row_guard_transfer), then the response
-- stored with the claim (idempotency_complete). Called as one statement,
-- it commits or rolls back as a whole. backend/src/transfer/transaction.rs
-- calls it.

-- Why transfer() (or payout()) refused before the layers; nothing is
-- written. 'unknown_target': the target is out of the caller's reach, and
-- is answered as no wallet at all.
CREATE TYPE access_refusal AS ENUM ('token_not_live', 'not_owner', 'unknown_target');

-- The race lab's sandbox, as a caller's requests see it: a wallet no
-- transfer of p_user's may name. A lab payouts' holds wallet (slot 3) is
-- no wallet to a transfer, even its visitor's: money enters and leaves it
-- only as payouts do. Another visitor's lab wallet is no wallet at all,
-- so it cannot receive lab money, and nothing says which lab wallets
-- exist.
CREATE FUNCTION wallet_out_of_reach(p_user uuid, p_wallet uuid)
RETURNS boolean
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN EXISTS (
        SELECT 1 FROM wallets w
         WHERE w.id = p_wallet AND (w.lab_slot = 3 OR (w.lab_slot IS NOT NULL AND w.user_id <> p_user)));
END
$$;

-- The access check before the layers: the token is live, the caller owns
-- the wallet money leaves from (p_from), and the wallet it goes to (p_to,
-- when the request names one: a payout does not) is within the caller's
-- reach. NULL when all hold. Read-only, so a refusal writes nothing;
-- transfer() and payout() call it, and so does the statement-by-statement
-- path, whose row guard (row_guard_transfer()) knows nothing of the race
-- lab.
CREATE FUNCTION access_refused(p_user uuid, p_token_hash bytea, p_from uuid, p_to uuid DEFAULT NULL)
RETURNS access_refusal
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF NOT token_is_live(p_token_hash, p_user) THEN
        RETURN 'token_not_live';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM wallets w WHERE w.id = p_from AND w.user_id = p_user)
       OR wallet_out_of_reach(p_user, p_from) THEN
        RETURN 'not_owner';
    END IF;
    IF wallet_out_of_reach(p_user, p_to) THEN
        RETURN 'unknown_target';
    END IF;
    RETURN NULL;
END
$$;

-- The body of a 201, in one format whichever path made the transfer
-- (transfer(), or the statement-by-statement demonstration path).
CREATE FUNCTION transfer_receipt(
    p_transfer_id uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_created_at timestamptz,
    p_balance_minor_after bigint
)
RETURNS text
LANGUAGE sql STABLE AS $$
    SELECT format(
        '{"id":"%s","from_wallet_id":"%s","to_wallet_id":"%s","amount_minor":%s,"created_at":"%s","balance_minor_after":%s}',
        p_transfer_id, p_from, p_to, p_amount,
        to_char(p_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        p_balance_minor_after)
$$;

-- refused: why access was refused (nothing else is set), or NULL.
-- claim, claim_ms: layer 2's answer and its time here, when a key was sent.
-- guard, guard_ms: layer 3's answer and its time, when it ran.
-- response_*: the response to send, fresh or replayed, in the columns of
-- idempotency_keys.
CREATE FUNCTION transfer(
    p_user uuid,
    p_token_hash bytea,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int,
    p_transfer_id uuid,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_trace_id text,
    OUT refused access_refusal,
    OUT claim claim_verdict,
    OUT claim_ms double precision,
    OUT guard guard_verdict,
    OUT guard_ms double precision,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_refusal guard_verdict,
    OUT response_trace_id text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_guard record;
    v_started timestamptz;
BEGIN
    refused := access_refused(p_user, p_token_hash, p_from, p_to);
    IF refused IS NOT NULL THEN
        RETURN;
    END IF;

    -- Layer 2: the idempotency claim.
    IF p_key IS NOT NULL THEN
        v_started := clock_timestamp();
        SELECT * INTO v_claim
          FROM idempotency_claim(p_user, p_key, p_fingerprint, p_retention_hours, p_claim_wait_ms);
        claim := v_claim.outcome;
        claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
        IF claim <> 'started' THEN
            response_status := v_claim.response_status;
            response_body := v_claim.response_body;
            response_refusal := v_claim.response_refusal;
            response_trace_id := v_claim.response_trace_id;
            RETURN;
        END IF;
    END IF;

    -- Layer 3: the row guard.
    v_started := clock_timestamp();
    SELECT * INTO v_guard
      FROM row_guard_transfer(p_transfer_id, p_user, p_from, p_to, p_amount, p_key, p_wallet_wait_ms);
    guard := v_guard.outcome;
    guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    IF guard = 'not_owner' THEN
        -- Ownership was checked above and never changes.
        RAISE EXCEPTION 'row guard refused an owner';
    END IF;
    balance_minor_after := v_guard.balance_minor_after;
    created_at := v_guard.created_at;
    IF guard = 'accepted' THEN
        response_status := 201;
        response_body := transfer_receipt(
            p_transfer_id, p_from, p_to, p_amount, v_guard.created_at, v_guard.balance_minor_after);
    ELSE
        response_status := 422;
        response_refusal := guard;
    END IF;
    response_trace_id := p_trace_id;

    IF p_key IS NOT NULL THEN
        PERFORM idempotency_complete(p_user, p_key, guard, response_body, p_trace_id, p_transfer_id);
    END IF;
END
$$;

-- Many transfers in one call: each decided as transfer() decides it, in
-- one transaction, so that a batch costs one round trip and one commit.
-- Inputs are parallel arrays, one element per transfer; each row out is
-- one transfer's answer, by its index (1-based) in the arrays, in
-- transfer()'s columns.
--
-- Locks are taken in one global order across the whole batch, the order
-- every single transfer() also follows, so batches and single transfers
-- never deadlock:
--   1. the idempotency keys, claimed in (user, key) order by one insert
--      (a transfer() claims its one key before any wallet);
--   2. every wallet the batch will touch, locked at once in wallet-id
--      order (row_guard_transfer() locks its two in that order too);
--   3. then each transfer's row guard and stored answer, in input order;
--      its wallets are already held.
-- A transaction waiting on a key holds no wallet, and one holding wallets
-- waits for no key, so no cycle can form.
--
-- Nothing here catches an error. A block that catches one is a
-- subtransaction, and a subtransaction that writes takes a transaction id
-- of its own: two per transfer, and a hot wallet's lock held while they
-- are taken. Instead, any error (a claim or a wallet waited on past its
-- wait, a balance out of range) undoes the whole call, and its caller
-- runs each transfer again alone, through transfer(), where each gets
-- its own answer: one transfer's failure never decides another's outcome,
-- it only costs the others a second call.
--
-- The claims are claim_first()'s, done for the batch in three statements:
-- expired claims of these keys are deleted; the live ones are inserted,
-- a key answered or held by another transaction being skipped (after
-- waiting for that transaction, at most p_claim_wait_ms); each key skipped
-- is then read and decided by claim_verdict_of_stored(). The same key
-- twice in one batch is the caller's error: the second finds the first in
-- flight. claim_ms is the time of the batch's claims, for each transfer.
CREATE TYPE transfer_answer AS (
    refused access_refusal,
    claim claim_verdict,
    claim_ms double precision,
    guard guard_verdict,
    guard_ms double precision,
    balance_minor_after bigint,
    created_at timestamptz,
    response_status smallint,
    response_body text,
    response_refusal guard_verdict,
    response_trace_id text
);

CREATE FUNCTION transfer_batch(
    p_users uuid[],
    p_token_hashes bytea[],
    p_keys uuid[],
    p_fingerprints bytea[],
    p_transfer_ids uuid[],
    p_froms uuid[],
    p_tos uuid[],
    p_amounts bigint[],
    p_trace_ids text[],
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int
)
RETURNS TABLE (idx int, answer transfer_answer)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_n int := coalesce(array_length(p_users, 1), 0);
    v_answers transfer_answer[];
    v_going boolean[];
    v_claiming boolean[];
    v_claimed int[];
    v_claim_ms double precision;
    v_stored idempotency_keys;
    v_guard record;
    v_started timestamptz;
    v_i int;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_answers := array_fill(NULL::transfer_answer, ARRAY[v_n]);
    v_going := array_fill(false, ARRAY[v_n]);
    v_claiming := array_fill(false, ARRAY[v_n]);

    -- Access, each transfer's own; read-only.
    FOR v_i IN 1 .. v_n LOOP
        v_answers[v_i].refused := access_refused(p_users[v_i], p_token_hashes[v_i], p_froms[v_i], p_tos[v_i]);
        v_going[v_i] := v_answers[v_i].refused IS NULL;
        v_claiming[v_i] := v_going[v_i] AND p_keys[v_i] IS NOT NULL;
    END LOOP;

    -- 1. Layer 2: the keys. Only a claim inserted here goes on.
    IF true = ANY (v_claiming) THEN
        v_started := clock_timestamp();
        PERFORM set_config('lock_timeout', p_claim_wait_ms || 'ms', true);
        -- An expired key is deleted so that it can be claimed again. One
        -- key at a time, each by its primary key, in the keys' order: an
        -- executor keeps its connection and this statement's plan for its
        -- whole life, and as one statement joined with the keys, the plan
        -- made while the table was nearly empty read the whole table on
        -- every call ever after.
        FOR v_i IN SELECT i FROM generate_subscripts(p_users, 1) AS i WHERE v_claiming[i]
                    ORDER BY p_users[i], p_keys[i] LOOP
            DELETE FROM idempotency_keys k
             WHERE k.user_id = p_users[v_i] AND k.key = p_keys[v_i] AND k.expires_at <= now();
        END LOOP;
        WITH wanted AS (
            SELECT i, p_users[i] AS user_id, p_keys[i] AS key, p_fingerprints[i] AS fingerprint,
                   row_number() OVER (PARTITION BY p_users[i], p_keys[i] ORDER BY i) = 1 AS first_copy
              FROM generate_subscripts(p_users, 1) AS i
             WHERE v_claiming[i]
        ), claimed AS (
            INSERT INTO idempotency_keys (user_id, key, fingerprint, created_at, expires_at)
            SELECT user_id, key, fingerprint, now(), now() + make_interval(hours => p_retention_hours)
              FROM wanted
             WHERE first_copy
             ORDER BY user_id, key
                ON CONFLICT DO NOTHING
            RETURNING user_id, key
        )
        SELECT coalesce(array_agg(w.i), '{}') INTO v_claimed
          FROM wanted w
          JOIN claimed c ON w.first_copy AND c.user_id = w.user_id AND c.key = w.key;
        v_claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;

        -- A key skipped was answered, or is held, or was reused: its row
        -- says which (this statement's snapshot sees what was waited for).
        FOR v_i IN 1 .. v_n LOOP
            CONTINUE WHEN NOT v_claiming[v_i];
            v_answers[v_i].claim_ms := v_claim_ms;
            v_going[v_i] := v_i = ANY (v_claimed);
            IF v_going[v_i] THEN
                v_answers[v_i].claim := 'started';
                CONTINUE;
            END IF;
            SELECT * INTO v_stored FROM idempotency_keys k WHERE k.user_id = p_users[v_i] AND k.key = p_keys[v_i];
            v_answers[v_i].claim := claim_verdict_of_stored(
                v_stored.fingerprint, p_fingerprints[v_i], v_stored.response_status IS NOT NULL);
            IF v_answers[v_i].claim <> 'key_reused' THEN
                v_answers[v_i].response_status := v_stored.response_status;
                v_answers[v_i].response_body := v_stored.response_body;
                v_answers[v_i].response_refusal := v_stored.response_refusal;
                v_answers[v_i].response_trace_id := v_stored.response_trace_id;
            END IF;
        END LOOP;
    END IF;

    -- 2. Every wallet of the transfers still going, at once, in id order.
    -- The ids go in as one array, so that each wallet is looked up by its
    -- key: joined with the subquery instead, the plan walked the wallets'
    -- key index from its start on every call, a cost that grew with the
    -- table.
    PERFORM set_config('lock_timeout', p_wallet_wait_ms || 'ms', true);
    PERFORM 1 FROM wallets w
      WHERE w.id = ANY (ARRAY(SELECT unnest(ARRAY[p_froms[i], p_tos[i]])
                                FROM generate_subscripts(p_users, 1) AS i WHERE v_going[i]))
      ORDER BY w.id
        FOR NO KEY UPDATE;

    -- 3. Layer 3: each row guard and stored answer, in input order; its
    -- wallets are held already.
    FOR v_i IN 1 .. v_n LOOP
        CONTINUE WHEN NOT v_going[v_i];
        v_started := clock_timestamp();
        SELECT * INTO v_guard
          FROM row_guard_transfer(p_transfer_ids[v_i], p_users[v_i], p_froms[v_i], p_tos[v_i],
                                  p_amounts[v_i], p_keys[v_i], p_wallet_wait_ms);
        IF v_guard.outcome = 'not_owner' THEN
            RAISE EXCEPTION 'row guard refused an owner';
        END IF;
        v_answers[v_i].guard := v_guard.outcome;
        v_answers[v_i].guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
        v_answers[v_i].balance_minor_after := v_guard.balance_minor_after;
        v_answers[v_i].created_at := v_guard.created_at;
        v_answers[v_i].response_trace_id := p_trace_ids[v_i];
        IF v_guard.outcome = 'accepted' THEN
            v_answers[v_i].response_status := 201;
            v_answers[v_i].response_body := transfer_receipt(
                p_transfer_ids[v_i], p_froms[v_i], p_tos[v_i], p_amounts[v_i], v_guard.created_at,
                v_guard.balance_minor_after);
        ELSE
            v_answers[v_i].response_status := 422;
            v_answers[v_i].response_refusal := v_guard.outcome;
        END IF;
        IF p_keys[v_i] IS NOT NULL THEN
            PERFORM idempotency_complete(p_users[v_i], p_keys[v_i], v_guard.outcome,
                                         v_answers[v_i].response_body, p_trace_ids[v_i], p_transfer_ids[v_i]);
        END IF;
    END LOOP;

    RETURN QUERY SELECT i, v_answers[i] FROM generate_subscripts(v_answers, 1) AS i ORDER BY i;
END
$$;
