-- pgstore 0018, downgrade: written by make revision from sql/; 0018_schedule_controls.py says what and why.

CREATE OR REPLACE FUNCTION schedule_claim_due(p_id text, p_owner text, p_now bigint, p_lease_ms bigint)
 RETURNS SETOF schedules
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
       AND s.next_run_at IS NOT NULL
       AND s.next_run_at <= v_now
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$function$;

COMMENT ON FUNCTION schedule_claim_due(text, text, bigint, bigint) IS
'Claims p_id for p_owner until now + p_lease_ms and bumps its fencing_token (to at '
'least token_floor(): above every token of an earlier timeline), only when it is due '
'(next_run_at IS NOT NULL AND next_run_at <= now) and has no live lease (lease_until '
'IS NULL OR lease_until <= now). Returns the claimed row, or no row: not due, leased '
'elsewhere, or unknown. One UPDATE; concurrent claimers of one id get exactly one '
'winner. 22023: p_lease_ms above store_settings.max_lease_ms.';

CREATE OR REPLACE FUNCTION schedule_complete(p_id text, p_fencing_token bigint, p_next_run_at bigint, p_last_run_at bigint, p_last_status text, p_now bigint DEFAULT NULL::bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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

    UPDATE schedules s
       SET next_run_at = p_next_run_at,
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
$function$;

COMMENT ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) IS
'Commits an occurrence only if p_fencing_token matches and the claim is still held: '
'writes next_run_at (NULL = tombstone), last_run_at and last_status (ok, error, or '
'skipped: the occurrence was not run), adds one to consecutive_failures for ''error'' '
'(reset to 0 for ''ok'', kept for ''skipped''), clears the lease, updated_at = now. '
'False when stale (claimed again since), already completed, re-registered or '
'deleted; then nothing changes.';

CREATE OR REPLACE FUNCTION schedule_claim_next(p_owner text, p_now bigint, p_lease_ms bigint, p_limit integer, p_ids text[] DEFAULT NULL::text[])
 RETURNS SETOF schedules
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
                        WHERE c.next_run_at IS NOT NULL
                          AND c.next_run_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.next_run_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY next_run_at, id;
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
                          AND c.next_run_at IS NOT NULL
                          AND c.next_run_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.next_run_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY next_run_at, id;
    END IF;
END
$function$;

COMMENT ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) IS
'Claims up to p_limit due, unleased records for p_owner (earliest next_run_at first, '
'ties by id), bumping each fencing_token (to at least token_floor()), in one '
'statement; rows locked by concurrent claimers are skipped. Only ids in p_ids when '
'given (''{}'' claims nothing, NULL means no filter). Returns the claimed rows in that '
'order. Never more than p_limit rows. An empty answer means nothing claimable right '
'now, not that nothing is due. 22023: p_lease_ms above store_settings.max_lease_ms.';

DROP FUNCTION schedule_register(text, text, text, bigint, bigint, text, bigint);

CREATE OR REPLACE FUNCTION schedule_register(p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL::bigint, p_catch_up text DEFAULT 'once'::text)
 RETURNS schedules
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO schedules AS s
               (id, kind, spec, next_run_at, fencing_token, updated_at, catch_up)
        VALUES (p_id, p_kind, p_spec, p_next_run_at,
                greatest(coalesce((SELECT f.fencing_token FROM schedule_fences f
                                    WHERE f.id = p_id), 0),
                         token_floor_at((SELECT e.epoch FROM store_epoch e))),
                v_now, p_catch_up)
        ON CONFLICT (id) DO UPDATE
            SET kind = excluded.kind,
                spec = excluded.spec,
                -- A new policy alone keeps the occurrence: the grid is the same.
                next_run_at = CASE WHEN (s.kind, s.spec)
                                        IS DISTINCT FROM (excluded.kind, excluded.spec)
                                   THEN excluded.next_run_at
                                   ELSE s.next_run_at END,
                catch_up = excluded.catch_up,
                updated_at = excluded.updated_at
            WHERE (s.kind, s.spec, s.catch_up)
                  IS DISTINCT FROM (excluded.kind, excluded.spec, excluded.catch_up);
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
$function$;

COMMENT ON FUNCTION schedule_register(text, text, text, bigint, bigint, text) IS
'Absent: insert with fencing_token = the id''s high-water mark (or 0, and at least '
'token_floor()), catch_up = p_catch_up and updated_at = now. Present with the same '
'kind, spec and catch_up: untouched (a restart keeps its next_run_at). Present with '
'another kind or spec: overwrite kind, spec, next_run_at and catch_up, updated_at = '
'now; token, lease and last_* kept. Present with the same kind and spec but another '
'catch_up: only catch_up and updated_at change. Returns the stored row. '
'p_next_run_at may be NULL (a tombstone). p_spec: at most 1024 characters. '
'p_catch_up: skip, once (the default) or all; the store keeps it, the caller that '
'computes next_run_at applies it.';

REVOKE ALL ON FUNCTION schedule_register(text, text, text, bigint, bigint, text) FROM PUBLIC;

DROP FUNCTION schedule_trigger(text, bigint);

DROP FUNCTION schedule_resume(text, bigint);

DROP FUNCTION schedule_pause(text, bigint);

ALTER TABLE schedules
    DROP COLUMN due_at,
    DROP COLUMN triggered_at,
    DROP COLUMN jitter_ms,
    DROP COLUMN paused;

DROP FUNCTION schedule_due_at(text, bigint, bigint);
