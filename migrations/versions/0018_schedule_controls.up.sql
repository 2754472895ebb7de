-- pgstore 0018, upgrade: written by make revision from sql/; 0018_schedule_controls.py says what and why.

-- The columns of the schedule controls; due_at, generated from schedule_due_at,
-- follows that function below. Existing rows: not paused, no jitter, no trigger,
-- due_at = next_run_at (what the claims compared before).
ALTER TABLE schedules
    ADD COLUMN paused boolean NOT NULL DEFAULT false,
    ADD COLUMN jitter_ms bigint NOT NULL DEFAULT 0,
    ADD COLUMN triggered_at bigint,
    ADD CONSTRAINT schedules_jitter_ms_check CHECK (jitter_ms BETWEEN 0 AND 86400000);

COMMENT ON COLUMN schedules.paused IS
'Set by schedule_pause, cleared by schedule_resume: a paused schedule is never claimed '
'(a lease already held runs on). schedule_register leaves it as it is.';
COMMENT ON COLUMN schedules.jitter_ms IS
'Each occurrence becomes claimable a deterministic amount in [0, jitter_ms) after '
'next_run_at: schedule_due_at(id, next_run_at, jitter_ms). 0: no jitter.';
COMMENT ON COLUMN schedules.triggered_at IS
'Set by schedule_trigger: a run out of turn is asked for (the next claim takes it) or held '
'(the current claim is that run: its complete keeps next_run_at). NULL: none.';

CREATE FUNCTION schedule_due_at(p_id text, p_next_run_at bigint, p_jitter_ms bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_next_run_at IS NULL OR p_jitter_ms IS NULL OR p_jitter_ms <= 0
                THEN p_next_run_at
                ELSE (SELECT CASE WHEN p_next_run_at > 9223372036854775807 - o.offset_ms
                                  THEN 9223372036854775807
                                  ELSE p_next_run_at + o.offset_ms END
                        FROM (SELECT ('x' || left(md5(p_id || ' ' || p_next_run_at::text), 12))
                                         ::bit(48)::bigint % p_jitter_ms AS offset_ms) AS o)
           END
$$;

COMMENT ON FUNCTION schedule_due_at(text, bigint, bigint) IS
'p_next_run_at plus the deterministic jitter of (p_id, p_next_run_at): the first 48 bits '
'of md5(p_id || '' '' || p_next_run_at) modulo p_jitter_ms, in [0, p_jitter_ms); '
'p_next_run_at itself when p_jitter_ms is 0 (or NULL); NULL for NULL; at most the bigint '
'maximum.';

-- Rewrites the table once (a stored generated column), computing each row's due_at.
ALTER TABLE schedules
    ADD COLUMN due_at bigint GENERATED ALWAYS AS (least(schedule_due_at(id, next_run_at, jitter_ms), triggered_at)) STORED;

COMMENT ON COLUMN schedules.due_at IS
'When the schedule may be claimed next: the occurrence at next_run_at (the nominal time) '
'plus its jitter, schedule_due_at(id, next_run_at, jitter_ms), or a pending trigger''s '
'triggered_at when earlier. Generated: it cannot disagree. NULL for a tombstone with no '
'trigger. The claims compare it with now, so the claim path costs what it did.';

DROP FUNCTION schedule_register(text, text, text, bigint, bigint, text);

CREATE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL,
    p_catch_up text DEFAULT 'once', p_jitter_ms bigint DEFAULT 0
) RETURNS schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
    v_row schedules;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_one_of('kind', p_kind, ARRAY['cron', 'interval', 'once']);
    PERFORM check_present('spec', p_spec);
    PERFORM check_length('spec', p_spec);
    PERFORM check_one_of('catch_up', p_catch_up, ARRAY['skip', 'once', 'all']);
    IF p_jitter_ms IS NULL OR p_jitter_ms < 0 OR p_jitter_ms > 86400000 THEN
        PERFORM raise_invalid('jitter_ms must be an integer from 0 to 86400000 (a day)');
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO schedules AS s
               (id, kind, spec, next_run_at, fencing_token, updated_at, catch_up, jitter_ms)
        VALUES (p_id, p_kind, p_spec, p_next_run_at,
                greatest(coalesce((SELECT f.fencing_token FROM schedule_fences f
                                    WHERE f.id = p_id), 0),
                         token_floor_at((SELECT e.epoch FROM store_epoch e))),
                v_now, p_catch_up, p_jitter_ms)
        ON CONFLICT (id) DO UPDATE
            SET kind = excluded.kind,
                spec = excluded.spec,
                -- A new policy alone keeps the occurrence: the grid is the same.
                next_run_at = CASE WHEN (s.kind, s.spec)
                                        IS DISTINCT FROM (excluded.kind, excluded.spec)
                                   THEN excluded.next_run_at
                                   ELSE s.next_run_at END,
                catch_up = excluded.catch_up,
                jitter_ms = excluded.jitter_ms,
                updated_at = excluded.updated_at
            -- paused and triggered_at are the operator's: a restart keeps them.
            WHERE (s.kind, s.spec, s.catch_up, s.jitter_ms)
                  IS DISTINCT FROM (excluded.kind, excluded.spec, excluded.catch_up,
                                    excluded.jitter_ms);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'id is too long to index: at most about 2700 bytes of UTF-8';
    END;
    -- ON CONFLICT locks the existing row even when it is left untouched.

    -- A schedule_delete that committed while the INSERT waited on its row
    -- lock wrote a fence that the INSERT's snapshot could not see. This
    -- statement takes a new snapshot and lifts the token to that fence, so a
    -- token never goes backwards, whatever the interleaving.
    UPDATE schedules s
       SET fencing_token = f.fencing_token
      FROM schedule_fences f
     WHERE s.id = p_id AND f.id = p_id AND f.fencing_token > s.fencing_token;

    -- Under REPEATABLE READ or SERIALIZABLE, a delete that committed after
    -- this transaction's snapshot leaves the deleted row visible beside the
    -- new one and its fence invisible, so the INSERT may have started from an
    -- older fence (a token going backwards): a serialization failure, which
    -- the caller retries. Under READ COMMITTED only the live row is visible.
    IF (SELECT count(*) FROM schedules WHERE id = p_id) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'serialization_failure',
            MESSAGE = 'could not serialize access due to a concurrent schedule_delete',
            HINT = 'Retry the transaction.';
    END IF;

    SELECT * INTO STRICT v_row FROM schedules WHERE id = p_id;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION schedule_register(text, text, text, bigint, bigint, text, bigint) IS
'Absent: insert with fencing_token = the id''s high-water mark (or 0, and at '
'least token_floor()), catch_up = p_catch_up, jitter_ms = p_jitter_ms and '
'updated_at = now. Present with the same kind, spec, catch_up and jitter_ms: untouched (a '
'restart keeps its next_run_at). Present with another kind or spec: overwrite kind, '
'spec, next_run_at, catch_up and jitter_ms, updated_at = now; token, lease, last_*, '
'paused and triggered_at kept. '
'Present with the same kind and spec but another catch_up or jitter_ms: only those and '
'updated_at change (due_at follows jitter_ms). Returns the stored row. p_next_run_at may be NULL (a '
'tombstone). p_spec: at most 1024 characters. p_catch_up: skip, once (the '
'default) or all; the store keeps it, the caller that computes next_run_at '
'applies it. p_jitter_ms: 0 (the default, no jitter) to 86400000.';

CREATE OR REPLACE FUNCTION schedule_claim_due(
    p_id text, p_owner text, p_now bigint, p_lease_ms bigint
) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    v_now := check_lease(p_now, 'lease_ms', p_lease_ms);
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps

    -- token_floor() inlined: one row at most, and store_epoch is read once,
    -- by an InitPlan, only when a row is claimed.
    RETURN QUERY
    UPDATE schedules s
       SET lease_owner = p_owner,
           lease_until = v_until,
           fencing_token = greatest(s.fencing_token + 1,
                                    token_floor_at((SELECT e.epoch FROM store_epoch e)))
     WHERE s.id = p_id
       AND NOT s.paused
       AND s.due_at <= v_now
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$$;

COMMENT ON FUNCTION schedule_claim_due(text, text, bigint, bigint) IS
'Claims p_id for p_owner until now + p_lease_ms and bumps its fencing_token '
'(to at least token_floor(): above every token of an earlier timeline), '
'only when it is not paused, is due (due_at <= now: next_run_at plus its jitter, or '
'the time of a pending trigger), and has '
'no live lease (lease_until IS NULL OR lease_until <= now). Returns the claimed '
'row, or no row: not due, leased elsewhere, or unknown. One UPDATE; concurrent '
'claimers of one id get exactly one winner. 22023: p_lease_ms above '
'store_settings.max_lease_ms.';

CREATE OR REPLACE FUNCTION schedule_complete(
    p_id text, p_fencing_token bigint, p_next_run_at bigint,
    p_last_run_at bigint, p_last_status text, p_now bigint DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now       bigint;
    v_completed boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_present('fencing_token', p_fencing_token);
    PERFORM check_present('last_run_at', p_last_run_at);
    PERFORM check_one_of('last_status', p_last_status, ARRAY['ok', 'error', 'skipped']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- A triggered run (triggered_at set: schedule_trigger refuses a live lease and
    -- fences an expired one, so the claim this token holds is the triggered one)
    -- leaves the regular occurrence where it was.
    UPDATE schedules s
       SET next_run_at = CASE WHEN s.triggered_at IS NULL THEN p_next_run_at
                              ELSE s.next_run_at END,
           triggered_at = NULL,
           last_run_at = p_last_run_at,
           last_status = p_last_status,
           consecutive_failures = CASE p_last_status
                                      WHEN 'ok' THEN 0
                                      WHEN 'error'
                                      THEN least(s.consecutive_failures, 2147483646) + 1
                                      ELSE s.consecutive_failures END,
           lease_owner = NULL,
           lease_until = NULL,
           updated_at = v_now
     WHERE id = p_id
       AND fencing_token = p_fencing_token
       AND lease_owner IS NOT NULL
    RETURNING true INTO v_completed;
    RETURN coalesce(v_completed, false);
END
$$;

COMMENT ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) IS
'Commits an occurrence only if p_fencing_token matches and the claim is still '
'held: writes next_run_at (NULL = tombstone; kept, and p_next_run_at ignored, when '
'the claim is a triggered run: triggered_at set, then cleared), last_run_at and last_status (ok, '
'error, or skipped: the occurrence was not run), '
'adds one to consecutive_failures for ''error'' (reset to 0 for ''ok'', kept for '
'''skipped''), '
'clears the lease, updated_at = now. False when stale (claimed again since), '
'already completed, re-registered or deleted; then nothing changes.';

CREATE OR REPLACE FUNCTION schedule_claim_next(
    p_owner text, p_now bigint, p_lease_ms bigint, p_limit integer, p_ids text[] DEFAULT NULL
) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    PERFORM check_positive('limit', p_limit);
    IF EXISTS (SELECT FROM unnest(p_ids) AS i(id)
                WHERE i.id IS NULL OR i.id = '' OR length(i.id) > 1024) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'ids must hold non-empty strings of at most 1024 characters';
    END IF;
    v_now := check_lease(p_now, 'lease_ms', p_lease_ms);
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps

    -- Two static statements, not one filtered by "p_ids IS NULL OR c.id =
    -- ANY (p_ids)": after a few calls plpgsql runs a generic plan, which
    -- cannot know which side of that OR holds, so it read every row and
    -- searched the whole array for each one (20 ms for 1,000 ids over 1,000
    -- rows). Given ids, the generic plan now probes the primary key once
    -- per id, whatever the size of the table.
    --
    -- ARRAY(subquery) is an InitPlan: the candidates are locked and collected
    -- once, so no plan can re-scan them and claim more than p_limit rows.
    -- token_floor() is inlined in a scalar subquery, another InitPlan: the
    -- timeline and store_epoch are read once per call, not per row.
    IF p_ids IS NULL THEN
        RETURN QUERY
        WITH claimed AS (
            UPDATE schedules s
               SET lease_owner = p_owner,
                   lease_until = v_until,
                   fencing_token = greatest(s.fencing_token + 1,
                                            (SELECT token_floor_at((SELECT e.epoch FROM store_epoch e))))
             WHERE s.id = ANY (ARRAY(
                       SELECT c.id
                         FROM schedules c
                        WHERE NOT c.paused
                          AND c.due_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.due_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY due_at, id;
    ELSE
        RETURN QUERY
        WITH claimed AS (
            UPDATE schedules s
               SET lease_owner = p_owner,
                   lease_until = v_until,
                   fencing_token = greatest(s.fencing_token + 1,
                                            (SELECT token_floor_at((SELECT e.epoch FROM store_epoch e))))
             WHERE s.id = ANY (ARRAY(
                       SELECT c.id
                         FROM schedules c
                        WHERE c.id = ANY (p_ids)
                          AND NOT c.paused
                          AND c.due_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.due_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY due_at, id;
    END IF;
END
$$;

COMMENT ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) IS
'Claims up to p_limit unpaused, due (due_at <= now: the jittered occurrence or a pending '
'trigger), unleased records for p_owner (earliest due_at first, ties by id), bumping each fencing_token (to at least token_floor()), in '
'one statement; rows locked '
'by concurrent claimers are skipped. Only ids in p_ids when given (''{}'' claims '
'nothing, NULL means no filter). Returns the claimed rows in that order. '
'Never more than p_limit rows. An empty answer means nothing claimable right '
'now, not that nothing is due. 22023: p_lease_ms above store_settings.max_lease_ms.';

CREATE FUNCTION schedule_pause(p_id text, p_now bigint DEFAULT NULL) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    RETURN QUERY
    UPDATE schedules s SET paused = true, updated_at = v_now
     WHERE s.id = p_id AND NOT s.paused
    RETURNING s.*;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM schedules WHERE id = p_id;
    END IF;
END
$$;

COMMENT ON FUNCTION schedule_pause(text, bigint) IS
'Pauses p_id: no claim takes it (schedule_claim_due and schedule_claim_next skip it) '
'until schedule_resume. A lease already held runs on: its holder renews and completes '
'as usual. next_run_at, a pending trigger and the token are kept; updated_at = now '
'when it was not paused. Returns the record (paused), or no row for an unknown id. '
'schedule_register (a restart) never unpauses.';

CREATE FUNCTION schedule_resume(p_id text, p_now bigint DEFAULT NULL) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    RETURN QUERY
    UPDATE schedules s SET paused = false, updated_at = v_now
     WHERE s.id = p_id AND s.paused
    RETURNING s.*;
    IF NOT FOUND THEN
        RETURN QUERY SELECT * FROM schedules WHERE id = p_id;
    END IF;
END
$$;

COMMENT ON FUNCTION schedule_resume(text, bigint) IS
'Resumes p_id: claimable again. next_run_at is left where the pause found it, so the '
'occurrences missed meanwhile are met as after downtime: the scheduler that claims it '
'applies the schedule''s catch_up policy (skip, once or all). updated_at = now when it '
'was paused. Returns the record, or no row for an unknown id.';

CREATE FUNCTION schedule_trigger(p_id text, p_now bigint DEFAULT NULL) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- A live lease refuses the trigger: the holder's complete could not tell its
    -- run from the triggered one. An expired lease is fenced here (its token is
    -- passed, so its holder can neither renew nor complete), for the same reason.
    -- The triggered run itself is the next claim, which bumps the token again.
    RETURN QUERY
    UPDATE schedules s
       SET triggered_at = coalesce(s.triggered_at, v_now),
           fencing_token = CASE WHEN s.lease_owner IS NULL THEN s.fencing_token
                                ELSE greatest(s.fencing_token + 1,
                                              token_floor_at((SELECT e.epoch FROM store_epoch e)))
                           END,
           lease_owner = NULL,
           lease_until = NULL,
           updated_at = v_now
     WHERE s.id = p_id
       AND NOT s.paused
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$$;

COMMENT ON FUNCTION schedule_trigger(text, bigint) IS
'Asks for one run of p_id now, out of turn: sets triggered_at (kept when already set), '
'so due_at is at most now, and the next claim (schedule_claim_due or schedule_claim_next, '
'due or not) takes it with '
'a fresh fencing_token and a lease like any claim; its complete keeps next_run_at, so '
'the regular occurrences do not move. An expired lease is fenced (token bumped, lease '
'cleared): its holder can no longer renew or complete. Returns the record, or no row '
'when refused: unknown id, paused, or a live lease (a run in progress; try again after '
'it). Whoever claims it runs it: the trigger itself runs nothing.';

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
