-- Transfer commands from a broker: another service (a payroll run, a
-- batch) publishes them to Redis Streams, and every instance consumes
-- them as a member of one consumer group. backend/src/command/ documents
-- the consumer; this is the SQL that applies one command.
--
-- A command reaches a consumer at least once: again after a consumer's
-- claim time runs out while it is still working (so two consumers may
-- hold one command at once), after a crash between the commit and the
-- acknowledgement, after a rebalance. The inbox (source 'broker') makes
-- the second holder do nothing but acknowledge.

-- Each command's outcome, as stored in the inbox and published to the
-- results stream:
--   'applied'             the transfer was made;
--   'insufficient_funds'  the row guard refused the debit;
--   'unknown_source'      no real wallet has the source id;
--   'unknown_target'      no wallet can receive it (as for transfers: none
--                         out of the source owner's reach either,
--                         wallet_out_of_reach());
--   'currency_mismatch'   the wallets hold different currencies;
--   'too_old'             published longer ago than p_age_hours_max;
--   'published_in_future' published (by its entry id) more than
--                         p_future_s ahead of the database's clock;
--   'dead_lettered'       delivered commands_deliveries_max times without
--                         an outcome, or unreadable as a command (a field
--                         missing, malformed or unknown, or the same
--                         wallet as source and target); moved to the
--                         dead-letter stream.
CREATE TYPE command_verdict AS ENUM (
    'applied', 'insufficient_funds', 'unknown_source', 'unknown_target', 'currency_mismatch', 'too_old',
    'published_in_future', 'dead_lettered');

-- The result body, the same bytes for every delivery of one command.
CREATE FUNCTION command_result(
    p_command_id text,
    p_issuer text,
    p_verdict command_verdict,
    p_transfer_id uuid,
    p_reason text
)
RETURNS text
LANGUAGE sql IMMUTABLE AS $$
    SELECT json_strip_nulls(json_build_object(
        'command_id', p_command_id,
        'issuer', p_issuer,
        'outcome', p_verdict,
        'transfer_id', p_transfer_id,
        'reason', p_reason))::text
$$;

-- The owner of the real wallet a command's money leaves; NULL when no
-- real wallet has that id (a lab or clearing wallet is no source).
CREATE FUNCTION command_source_owner(p_from uuid)
RETURNS uuid
LANGUAGE sql STABLE AS $$
    SELECT w.user_id FROM wallets w
     WHERE w.id = p_from AND w.lab_slot IS NULL AND w.clearing_source IS NULL
$$;

-- The refusals a claimed command meets before the row guard, in this
-- order; NULL when the row guard decides. p_owner is
-- command_source_owner()'s answer.
--   too_old: too old to be told apart from a command whose claim was
--     swept: had it been applied, its row might be gone.
--   published_in_future: an entry id ahead of any clock's drift (XADD
--     with an explicit id): it would stay young past its claim's sweep,
--     and a copy published again then would be applied a second time.
CREATE FUNCTION broker_command_refusal(
    p_published_at timestamptz,
    p_dead_letter_reason text,
    p_age_hours_max int,
    p_future_s int,
    p_owner uuid,
    p_to uuid
)
RETURNS command_verdict
LANGUAGE sql STABLE AS $$
    SELECT CASE
        WHEN p_dead_letter_reason IS NOT NULL THEN 'dead_lettered'::command_verdict
        WHEN p_published_at < now() - make_interval(hours => p_age_hours_max) THEN 'too_old'
        WHEN p_published_at > now() + make_interval(secs => p_future_s) THEN 'published_in_future'
        WHEN p_owner IS NULL THEN 'unknown_source'
        WHEN wallet_out_of_reach(p_owner, p_to) THEN 'unknown_target'
    END
$$;

-- A claimed command's decision and stored outcome, alone or in a batch:
-- p_refusal (broker_command_refusal()'s answer) stands, or else the row
-- guard decides.
CREATE FUNCTION broker_command_decide(
    p_command_id text,
    p_issuer text,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_dead_letter_reason text,
    p_transfer_id uuid,
    p_owner uuid,
    p_refusal command_verdict,
    p_wallet_wait_ms int,
    OUT verdict text,
    OUT result text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_guard record;
    v_verdict command_verdict := p_refusal;
    v_transfer_id uuid;
BEGIN
    IF v_verdict IS NULL THEN
        SELECT * INTO v_guard
          FROM row_guard_transfer(p_transfer_id, p_owner, p_from, p_to, p_amount, NULL, p_wallet_wait_ms);
        v_verdict := CASE v_guard.outcome
            WHEN 'accepted' THEN 'applied'
            WHEN 'insufficient_funds' THEN 'insufficient_funds'
            WHEN 'unknown_target' THEN 'unknown_target'
            WHEN 'currency_mismatch' THEN 'currency_mismatch'
        END;
        IF v_verdict IS NULL THEN
            RAISE EXCEPTION 'the row guard answered % for the source wallet''s owner', v_guard.outcome;
        END IF;
    END IF;
    v_transfer_id := CASE WHEN v_verdict = 'applied' THEN p_transfer_id END;
    verdict := v_verdict::text;
    result := command_result(p_command_id, p_issuer, v_verdict, v_transfer_id, p_dead_letter_reason);
    PERFORM inbox_complete('broker', p_command_id, verdict,
                           (CASE WHEN v_verdict = 'applied' THEN 200 ELSE 422 END)::smallint,
                           result, NULL, v_transfer_id);
END
$$;

-- One command in one call: the inbox claim, the row guard's transfer from
-- the source wallet's owner, the result stored with the claim. With
-- p_dead_letter_reason set, the command is recorded as dead-lettered
-- instead, unless the inbox already holds its outcome. A command's time is
-- its stream entry's (p_published_at), which the broker may choose: it is
-- accepted only from p_age_hours_max ago to p_future_s ahead of now. The
-- claim is kept p_retention_hours, longer than those two together, so that
-- every command a swept claim could stand for is refused as too old.
CREATE FUNCTION broker_command(
    p_command_id text,
    p_fingerprint bytea,
    p_issuer text,
    p_from uuid,
    p_to uuid,
    p_amount bigint,
    p_published_at timestamptz,
    p_dead_letter_reason text,
    p_age_hours_max int,
    p_future_s int,
    p_retention_hours int,
    p_claim_wait_ms int,
    p_wallet_wait_ms int,
    p_transfer_id uuid,
    OUT claim inbox_claim_verdict,
    OUT claim_ms double precision,
    OUT guard_ms double precision,
    OUT verdict text,
    OUT owner uuid,
    OUT result text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
    v_decided record;
    v_started timestamptz;
BEGIN
    v_started := clock_timestamp();
    SELECT * INTO v_claim
      FROM inbox_claim('broker', p_command_id, p_fingerprint, p_retention_hours, p_claim_wait_ms);
    claim := v_claim.outcome;
    claim_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    owner := command_source_owner(p_from);
    IF claim <> 'started' THEN
        verdict := v_claim.verdict;
        result := v_claim.response_body;
        RETURN;
    END IF;

    v_started := clock_timestamp();
    SELECT * INTO v_decided
      FROM broker_command_decide(
        p_command_id, p_issuer, p_from, p_to, p_amount, p_dead_letter_reason, p_transfer_id, owner,
        broker_command_refusal(p_published_at, p_dead_letter_reason, p_age_hours_max, p_future_s, owner, p_to),
        p_wallet_wait_ms);
    guard_ms := extract(epoch FROM clock_timestamp() - v_started) * 1000;
    verdict := v_decided.verdict;
    result := v_decided.result;
END
$$;

-- An entry that is no command but carried a well-formed command id: it is
-- recorded as dead-lettered under that id, so that its issuer finds it by
-- the id (GET /commands/{id}) and stops publishing it again. The
-- fingerprint is the entry's own fields', so the same entry published
-- again replays this outcome, and an id that names another command already
-- ('payload_changed') leaves that command's outcome standing. p_issuer is
-- NULL when the entry's issuer was unusable.
CREATE FUNCTION broker_command_unreadable(
    p_command_id text,
    p_fingerprint bytea,
    p_issuer text,
    p_reason text,
    p_retention_hours int,
    p_claim_wait_ms int,
    OUT claim inbox_claim_verdict,
    OUT verdict text,
    OUT result text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_variable
DECLARE
    v_claim record;
BEGIN
    SELECT * INTO v_claim
      FROM inbox_claim('broker', p_command_id, p_fingerprint, p_retention_hours, p_claim_wait_ms);
    claim := v_claim.outcome;
    IF claim <> 'started' THEN
        verdict := v_claim.verdict;
        result := v_claim.response_body;
        RETURN;
    END IF;
    verdict := 'dead_lettered';
    result := command_result(p_command_id, p_issuer, 'dead_lettered', NULL, p_reason);
    PERFORM inbox_complete('broker', p_command_id, verdict, 422::smallint, result, NULL, NULL);
END
$$;
