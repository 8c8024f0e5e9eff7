-- Money that leaves: payouts through a bank gateway. backend/src/payout/
-- documents the saga; this is its SQL.
--
-- A transaction cannot include the gateway's sending, so a payout is
-- split at the boundary:
--
--   1. the request's transaction claims the idempotency key, moves the
--      amount from the wallet into the holds wallet (the row guard checks
--      the available balance in the same statement that debits it), and
--      writes the payout and its outbox row: payout();
--   2. a dispatcher takes due outbox rows under a lease (payout_take())
--      and asks the gateway, outside any transaction, with the payout's id
--      as the gateway's Idempotency-Key;
--   3. the gateway's answer is recorded in one transaction each: sent,
--      the hold moves to the gateway's clearing wallet (payout_settle());
--      refused for good, the hold moves back (payout_release()); unknown,
--      the row is due again later, or needs a person once its attempts are
--      spent (payout_postpone()).
--
-- Every movement is a transfer with two ledger entries, so double entry
-- holds throughout; money_invariants() checks the payouts too.
--
-- Locks are always taken in the order: the person's wallet, the holds
-- wallet, the gateway's wallet; transfers never lock a clearing wallet,
-- so payouts and transfers cannot deadlock. Every payout updates the one
-- holds row: payouts serialise on it between that update and the commit.

-- pending          held, in the outbox; the gateway was never asked;
-- sent             the gateway was asked at least once, and its answer is
--                  not known yet: the money may have left;
-- settled          the gateway sent it; the hold became a posted debit;
-- failed           the gateway refused it for good; the hold was released;
-- needs_attention  every attempt ended without a known outcome, or a retry
--                  came after the gateway may have forgotten the key; the
--                  hold stays until `wallet-server reconcile` asks the
--                  gateway, or a person looks.
CREATE TYPE payout_state AS ENUM ('pending', 'sent', 'settled', 'failed', 'needs_attention');

CREATE TABLE payouts (
    id                  uuid         PRIMARY KEY,
    user_id             uuid         NOT NULL REFERENCES users (id),
    wallet_id           uuid         NOT NULL REFERENCES wallets (id),
    amount_minor        bigint       NOT NULL CHECK (amount_minor > 0),
    currency            currency_code NOT NULL,
    destination         text         NOT NULL CHECK (destination ~ '^[A-Za-z0-9_.:-]{1,64}$'),
    idempotency_key     uuid,
    state               payout_state NOT NULL DEFAULT 'pending',
    -- Requests sent to the gateway so far (a lease taken counts as one).
    attempts            int          NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    hold_transfer_id    uuid         NOT NULL UNIQUE REFERENCES transfers (id),
    settle_transfer_id  uuid         UNIQUE REFERENCES transfers (id),
    release_transfer_id uuid         UNIQUE REFERENCES transfers (id),
    -- The gateway's id for the sending, once it said it sent.
    gateway_reference   text         CHECK (length(gateway_reference) <= 128),
    -- Why the gateway refused, or why the payout needs a person.
    reason              text         CHECK (length(reason) <= 300),
    -- The W3C traceparent of the request that made it: the dispatcher's
    -- spans continue its trace.
    traceparent         text         CHECK (length(traceparent) <= 64),
    created_at          timestamptz  NOT NULL DEFAULT now(),
    updated_at          timestamptz  NOT NULL DEFAULT now(),
    CONSTRAINT payouts_settled_has_its_transfer CHECK ((state = 'settled') = (settle_transfer_id IS NOT NULL)),
    CONSTRAINT payouts_failed_has_its_transfer CHECK ((state = 'failed') = (release_transfer_id IS NOT NULL))
);
CREATE INDEX payouts_user_idx ON payouts (user_id, created_at DESC, id DESC);
CREATE INDEX payouts_wallet_idx ON payouts (wallet_id);

-- Whether a payout in this state still holds its amount: it has neither
-- settled nor been released.
CREATE FUNCTION payout_holds(p_state payout_state)
RETURNS boolean
LANGUAGE sql IMMUTABLE AS $$
    SELECT p_state IN ('pending', 'sent', 'needs_attention')
$$;

-- What a wallet's payouts hold now. Its balance_minor is what it can spend
-- (its available balance); its posted balance is that plus this.
CREATE FUNCTION payouts_held_minor(p_wallet uuid)
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT coalesce(sum(amount_minor), 0)::bigint FROM payouts WHERE wallet_id = p_wallet AND payout_holds(state)
$$;
CREATE INDEX payouts_needing_attention_idx ON payouts (created_at) WHERE state = 'needs_attention';

-- Where a payout's amount is in p_role 'holds' (waiting while the gateway
-- is asked) and in p_role 'gateway' (once the gateway has sent it): the
-- deployment's clearing wallet of that name in the payout's currency. A
-- race-lab payout (lab money, LAB) is held in its visitor's lab slot 3 and
-- goes to their lab wallet B, which stands in for the lab bank's clearing
-- account; the lab's bank is asked by the race lab itself, never by the
-- dispatcher (payout_take()).
CREATE FUNCTION payout_wallet(p_role text, p_user uuid, p_currency text)
RETURNS uuid
LANGUAGE sql STABLE AS $$
    -- Two branches rather than one CASE, so that each finds its row by an
    -- index (clearing_source's, and the lab slots').
    SELECT id FROM wallets
     WHERE p_currency <> 'LAB' AND clearing_source = p_role AND currency = p_currency
    UNION ALL
    SELECT id FROM wallets
     WHERE p_currency = 'LAB' AND user_id = p_user
       AND lab_slot = CASE p_role WHEN 'holds' THEN 3 WHEN 'gateway' THEN 2 END
$$;

-- The outbox: one row per payout whose gateway call is still to be made
-- (or made again). due_at is when a dispatcher may take it: a taken row is
-- due again when its lease runs out, so a crashed instance's row is taken
-- over; the lease token says whose lease it is. A row is deleted when its
-- payout settles, fails or needs a person.
CREATE TABLE payout_outbox (
    payout_id   uuid        PRIMARY KEY REFERENCES payouts (id),
    due_at      timestamptz NOT NULL DEFAULT now(),
    lease_token uuid,
    last_error  text        CHECK (length(last_error) <= 300)
);
CREATE INDEX payout_outbox_due_idx ON payout_outbox (due_at);

-- The body of a 202, the same bytes for every replay of the request.
CREATE FUNCTION payout_receipt(
    p_payout_id uuid,
    p_wallet uuid,
    p_amount bigint,
    p_currency text,
    p_destination text,
    p_created_at timestamptz,
    p_available_minor_after bigint
)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT format(
        '{"id":"%s","from_wallet_id":"%s","amount_minor":%s,"currency":"%s","destination":%s,"state":"pending","created_at":"%s","available_balance_minor_after":%s}',
        p_payout_id, p_wallet, p_amount, p_currency, to_json(p_destination),
        to_char(p_created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'),
        p_available_minor_after)
$$;

-- Layer 3 for a payout: the hold. The wallet's available balance is its
-- balance_minor (held money has already moved to the holds wallet), so the
-- guard is the transfer's: check and debit in one statement.
--   'accepted'            held, recorded, in the outbox;
--   'insufficient_funds'  the available balance is lower; nothing written;
--   'not_owner'           not the caller's real wallet (lab and clearing
--                         wallets pay nothing out), or, with p_lab, not the
--                         caller's lab wallet A; nothing written;
--   'currency_mismatch'   no holds wallet in the wallet's currency.
CREATE FUNCTION payout_hold(
    p_payout_id uuid,
    p_hold_transfer_id uuid,
    p_user uuid,
    p_wallet uuid,
    p_amount bigint,
    p_destination text,
    p_key uuid,
    p_traceparent text,
    p_wait_ms int,
    p_lab boolean,
    OUT outcome guard_verdict,
    OUT currency text,
    OUT balance_minor_after bigint,
    OUT created_at timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_holds uuid;
BEGIN
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    SELECT w.currency INTO currency
      FROM wallets w
     WHERE w.id = p_wallet AND w.user_id = p_user AND w.clearing_source IS NULL
       AND CASE WHEN p_lab THEN w.lab_slot = 1 ELSE w.lab_slot IS NULL END
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        outcome := 'not_owner';
        RETURN;
    END IF;
    UPDATE wallets SET balance_minor = balance_minor - p_amount, version = version + 1
     WHERE id = p_wallet AND balance_minor >= p_amount
    RETURNING balance_minor INTO balance_minor_after;
    IF NOT FOUND THEN
        outcome := 'insufficient_funds';
        RETURN;
    END IF;
    UPDATE wallets SET balance_minor = balance_minor + p_amount, version = version + 1
     WHERE id = payout_wallet('holds', p_user, payout_hold.currency)
    RETURNING id INTO v_holds;
    IF NOT FOUND THEN
        -- Rolls the debit back with the rest of the transaction.
        RAISE EXCEPTION 'no holds wallet in %', currency;
    END IF;
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by, idempotency_key)
    VALUES (p_hold_transfer_id, p_wallet, v_holds, p_amount, p_user, p_key)
    RETURNING transfers.created_at INTO created_at;
    INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
    VALUES (p_hold_transfer_id, p_wallet, -p_amount), (p_hold_transfer_id, v_holds, p_amount);
    INSERT INTO payouts (id, user_id, wallet_id, amount_minor, currency, destination, idempotency_key,
                         hold_transfer_id, traceparent, created_at, updated_at)
    VALUES (p_payout_id, p_user, p_wallet, p_amount, currency, p_destination, p_key,
            p_hold_transfer_id, p_traceparent, created_at, created_at);
    INSERT INTO payout_outbox (payout_id) VALUES (p_payout_id);
    outcome := 'accepted';
END
$$;

-- The whole request in one call, one round trip, as transfer() does it:
-- access, the idempotency claim, the hold with its outbox row, and the
-- response stored with the claim. With p_lab, a race-lab payout of lab
-- money from the caller's lab wallet A.
CREATE FUNCTION payout(
    p_user uuid,
    p_token_hash bytea,
    p_key uuid,
    p_fingerprint bytea,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int,
    p_payout_id uuid,
    p_hold_transfer_id uuid,
    p_wallet uuid,
    p_amount bigint,
    p_destination text,
    p_trace_id text,
    p_traceparent text,
    p_lab boolean,
    OUT refused access_refusal,
    OUT claim claim_verdict,
    OUT claim_ms double precision,
    OUT guard guard_verdict,
    OUT guard_ms double precision,
    OUT response_status smallint,
    OUT response_body text,
    OUT response_refusal guard_verdict,
    OUT response_trace_id text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_hold record;
    v_started timestamptz;
BEGIN
    refused := access_refused(p_user, p_token_hash, p_wallet);
    IF refused IS NOT NULL THEN
        RETURN;
    END IF;

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

    v_started := clock_timestamp();
    SELECT * INTO v_hold
      FROM payout_hold(p_payout_id, p_hold_transfer_id, p_user, p_wallet, p_amount, p_destination, p_key,
                       p_traceparent, p_wallet_wait_ms, p_lab);
    guard := v_hold.outcome;
    guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    IF guard = 'not_owner' THEN
        -- A lab or clearing wallet of the caller's: refused, nothing stored.
        -- The key was claimed in this transaction; the claim goes too, or
        -- every retry with the key would wait on an answer never stored.
        DELETE FROM idempotency_keys WHERE user_id = p_user AND key = p_key;
        RETURN;
    END IF;
    IF guard = 'accepted' THEN
        response_status := 202;
        response_body := payout_receipt(p_payout_id, p_wallet, p_amount, v_hold.currency, p_destination,
                                        v_hold.created_at, v_hold.balance_minor_after);
    ELSE
        response_status := 422;
        response_refusal := guard;
    END IF;
    response_trace_id := p_trace_id;
    IF p_key IS NOT NULL THEN
        PERFORM idempotency_complete(p_user, p_key, guard, response_body, p_trace_id,
                                     CASE WHEN guard = 'accepted' THEN p_hold_transfer_id END, 202::smallint);
    END IF;
END
$$;

-- A taken outbox row: what its sender needs for one attempt.
CREATE TYPE payout_taken AS (
    payout_id    uuid,
    lease_token  uuid,
    user_id      uuid,
    wallet_id    uuid,
    amount_minor bigint,
    currency     text,
    destination  text,
    attempts     int,
    traceparent  text,
    created_at   timestamptz
);

-- A take's lease: each of p_payout_ids' outbox rows, which the caller
-- locked (FOR UPDATE SKIP LOCKED, so nobody else is taking them), is
-- leased for p_lease_ms under a fresh token and counted as an attempt. A
-- pending payout becomes 'sent' here, before the call: from now on the
-- money may have left. created_at says how old the payout is: a retry past
-- the gateway's key retention is not sent.
CREATE FUNCTION payout_lease(p_payout_ids uuid[], p_lease_ms int)
RETURNS SETOF payout_taken
LANGUAGE sql AS $$
    WITH leased AS (
        UPDATE payout_outbox o
           SET due_at = now() + make_interval(secs => p_lease_ms / 1000.0),
               lease_token = gen_random_uuid()
         WHERE o.payout_id = ANY (p_payout_ids)
        RETURNING o.payout_id, o.lease_token
    ), counted AS (
        UPDATE payouts p
           SET attempts = p.attempts + 1,
               state = CASE WHEN p.state = 'pending' THEN 'sent'::payout_state ELSE p.state END,
               updated_at = now()
          FROM leased
         WHERE p.id = leased.payout_id
        RETURNING p.id, leased.lease_token, p.user_id, p.wallet_id, p.amount_minor, p.currency,
                  p.destination, p.attempts, p.traceparent, p.created_at
    )
    SELECT * FROM counted
$$;

-- The dispatcher's take: up to p_rows due outbox rows of real money that
-- nobody else is taking (SKIP LOCKED), each leased (payout_lease()). Lab
-- money is never sent to the gateway: the race lab takes its own
-- (race_lab_payout_take()) and sends it to the lab's own bank.
CREATE FUNCTION payout_take(p_rows int, p_lease_ms int)
RETURNS SETOF payout_taken
LANGUAGE sql AS $$
    SELECT * FROM payout_lease(ARRAY(
        SELECT o.payout_id FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id
         WHERE o.due_at <= now() AND p.currency <> 'LAB'
         ORDER BY o.due_at
         LIMIT p_rows
           FOR UPDATE OF o SKIP LOCKED
    ), p_lease_ms)
$$;

-- How the record of a gateway answer ended:
--   'done'            recorded now;
--   'already'         recorded before (another holder of the row, or an
--                     earlier reconcile): nothing written;
--   'contradicted'    the payout ended the other way (released, and the
--                     gateway now says sent; or settled, and it now says
--                     refused): nothing written, a person must look;
--   'lease_lost'      (payout_postpone) the row is no longer ours.
CREATE TYPE payout_record AS ENUM ('done', 'already', 'contradicted', 'lease_lost');

-- The gateway refused it for good: the hold goes back to the wallet, the
-- payout fails with the gateway's reason, and the outbox row goes. Called
-- only on a definitive refusal, never on an unknown outcome.
CREATE FUNCTION payout_release(
    p_payout_id uuid,
    p_release_transfer_id uuid,
    p_reason text,
    p_wait_ms int,
    OUT recorded payout_record,
    OUT owner uuid
)
LANGUAGE plpgsql AS $$
DECLARE
    v_payout payouts;
    v_holds uuid;
BEGIN
    SELECT * INTO STRICT v_payout FROM payouts WHERE id = p_payout_id FOR UPDATE;
    owner := v_payout.user_id;
    IF v_payout.state = 'failed' THEN
        recorded := 'already';
        RETURN;
    ELSIF v_payout.state = 'settled' THEN
        recorded := 'contradicted';
        RETURN;
    END IF;
    PERFORM set_config('lock_timeout', p_wait_ms || 'ms', true);
    UPDATE wallets SET balance_minor = balance_minor + v_payout.amount_minor, version = version + 1 WHERE id = v_payout.wallet_id;
    UPDATE wallets SET balance_minor = balance_minor - v_payout.amount_minor, version = version + 1
     WHERE id = payout_wallet('holds', v_payout.user_id, v_payout.currency)
    RETURNING id INTO STRICT v_holds;
    INSERT INTO transfers (id, from_wallet_id, to_wallet_id, amount_minor, initiated_by)
    VALUES (p_release_transfer_id, v_holds, v_payout.wallet_id, v_payout.amount_minor, v_payout.user_id);
    INSERT INTO ledger_entries (transfer_id, wallet_id, amount_minor)
    VALUES (p_release_transfer_id, v_holds, -v_payout.amount_minor),
           (p_release_transfer_id, v_payout.wallet_id, v_payout.amount_minor);
    UPDATE payouts
       SET state = 'failed', release_transfer_id = p_release_transfer_id,
           reason = left(p_reason, 300), updated_at = now()
     WHERE id = p_payout_id;
    DELETE FROM payout_outbox WHERE payout_id = p_payout_id;
    recorded := 'done';
END
$$;

-- The outcome is unknown (a time-out, a 5xx, a broken connection): the
-- row is due again after p_delay_ms, for the next attempt with the same
-- key. Once p_attempts_max attempts were made, or with p_give_up (an
-- answer no retry can change, that is not a refusal either; or a retry
-- not sent, past the gateway's key retention), the payout needs a person
-- instead, and keeps its hold. Only the lease's holder
-- may postpone it.
CREATE FUNCTION payout_postpone(
    p_payout_id uuid,
    p_lease_token uuid,
    p_delay_ms int,
    p_error text,
    p_attempts_max int,
    p_give_up boolean,
    OUT recorded payout_record,
    OUT needs_attention boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_attempts int;
BEGIN
    needs_attention := false;
    PERFORM 1 FROM payout_outbox WHERE payout_id = p_payout_id AND lease_token = p_lease_token FOR UPDATE;
    IF NOT FOUND THEN
        recorded := 'lease_lost';
        RETURN;
    END IF;
    SELECT attempts INTO STRICT v_attempts FROM payouts WHERE id = p_payout_id FOR UPDATE;
    IF p_give_up OR v_attempts >= p_attempts_max THEN
        UPDATE payouts SET state = 'needs_attention', reason = left(p_error, 300), updated_at = now()
         WHERE id = p_payout_id;
        DELETE FROM payout_outbox WHERE payout_id = p_payout_id;
        needs_attention := true;
    ELSE
        UPDATE payout_outbox
           SET due_at = now() + make_interval(secs => p_delay_ms / 1000.0),
               lease_token = NULL,
               last_error = left(p_error, 300)
         WHERE payout_id = p_payout_id;
    END IF;
    recorded := 'done';
END
$$;

-- What the outbox looks like, for the metrics: rows waiting, the age of
-- the oldest one that is due, and payouts waiting for a person; real
-- money only (the race lab sends its own).
CREATE FUNCTION payout_census(
    OUT outbox_rows bigint,
    OUT oldest_due_age_s double precision,
    OUT needing_attention bigint
)
LANGUAGE sql STABLE AS $$
    SELECT (SELECT count(*) FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id WHERE p.currency <> 'LAB'),
           (SELECT coalesce(extract(epoch FROM now() - min(o.due_at)), 0)::double precision
              FROM payout_outbox o JOIN payouts p ON p.id = o.payout_id
             WHERE o.due_at <= now() AND p.currency <> 'LAB'),
           (SELECT count(*) FROM payouts WHERE state = 'needs_attention' AND currency <> 'LAB')
$$;
