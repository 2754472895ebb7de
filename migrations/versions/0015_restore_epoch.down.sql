-- pgstore, the restore epoch, downgrade: back to the bodies of the revision
-- before (token_floor() = 2^40 * (timeline - 1) again, read without a table)
-- and without store_epoch, fence_after_restore, token_floor_at and
-- raise_no_epoch. The epoch a fence set is lost with the table: tokens and
-- lease sequences already handed out stay, but an id below the fenced floor
-- could then be handed out one a lost server had (fence again after
-- upgrading). The revision's module sets schema_revision().

DROP FUNCTION fence_after_restore(integer);

CREATE OR REPLACE FUNCTION token_floor() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    -- The first 8 hex digits of a WAL file name are its timeline ID. The
    -- product (not a shift, which wraps) raises 22003 beyond timeline 2^23.
    SELECT (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)
           * 1099511627776
$$;

COMMENT ON FUNCTION token_floor() IS
'2^40 * (the server''s timeline ID - 1): the least fencing token and lease '
'sequence a write may hand out, so none goes backwards across a promotion (0 on '
'timeline 1). Only on a primary: check_primary first.';

CREATE OR REPLACE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL,
    p_catch_up text DEFAULT 'once'
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
                         token_floor()),
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
$$;

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
    v_floor bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    v_now := check_lease(p_now, 'lease_ms', p_lease_ms);
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps
    v_floor := token_floor();  -- once per call, not per row

    RETURN QUERY
    UPDATE schedules s
       SET lease_owner = p_owner,
           lease_until = v_until,
           fencing_token = greatest(s.fencing_token + 1, v_floor)
     WHERE s.id = p_id
       AND s.next_run_at IS NOT NULL
       AND s.next_run_at <= v_now
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$$;

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
    v_floor bigint;
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
    v_floor := token_floor();  -- once per call, not per row

    -- Two static statements, not one filtered by "p_ids IS NULL OR c.id =
    -- ANY (p_ids)": after a few calls plpgsql runs a generic plan, which
    -- cannot know which side of that OR holds, so it read every row and
    -- searched the whole array for each one (20 ms for 1,000 ids over 1,000
    -- rows). Given ids, the generic plan now probes the primary key once
    -- per id, whatever the size of the table.
    --
    -- ARRAY(subquery) is an InitPlan: the candidates are locked and collected
    -- once, so no plan can re-scan them and claim more than p_limit rows.
    IF p_ids IS NULL THEN
        RETURN QUERY
        WITH claimed AS (
            UPDATE schedules s
               SET lease_owner = p_owner,
                   lease_until = v_until,
                   fencing_token = greatest(s.fencing_token + 1, v_floor)
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
                   fencing_token = greatest(s.fencing_token + 1, v_floor)
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
$$;

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The scalar subquery on run_id is an InitPlan: it runs once, walks the
    -- pending index in lease order and locks one row, skipping rows that
    -- concurrent leasers hold locked. The one on job_fences is read in this
    -- statement, with its snapshot: a row visible to it was scheduled after
    -- any purge or remove of its run_id that the mark must cover.
    --
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned: the call then
    -- answers no row, and the next call leases the next job.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1, token_floor(),
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = (
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched
                      AND NOT c.cancelled
                      AND NOT c.failed
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed;
END
$$;

CREATE OR REPLACE FUNCTION job_lease_many(
    p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer
) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
    v_floor bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_positive('limit', p_limit);
    IF p_limit > batch_max() THEN
        PERFORM raise_invalid(format('limit must be at most %s', batch_max()));
    END IF;
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps
    -- Once per call, not once per row (token_floor() is VOLATILE: inlined into
    -- the SET list it read the WAL position for every job). One value is right
    -- for the whole batch: a primary writes on one timeline for as long as it
    -- runs, and check_primary() above has refused a standby.
    v_floor := token_floor();

    -- job_lease's walk with LIMIT p_limit: the ARRAY() subquery is an InitPlan
    -- that runs once, walks the pending index in lease order and locks up to
    -- p_limit rows, skipping rows concurrent leasers hold locked; the UPDATE then
    -- reaches them through the primary key (an IN would let the planner hash-join
    -- a scan of the whole table). The answer comes back in lease order.
    --
    -- job_lease's rules for each job: job_fences is read by this statement (an
    -- InitPlan, once), never by an earlier one, and a job out of attempts is
    -- failed by this UPDATE instead of leased, and left out of the answer, so
    -- it may hold fewer than p_limit rows.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1, v_floor,
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = ANY (ARRAY(
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched
                      AND NOT c.cancelled
                      AND NOT c.failed
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
END
$$;

DROP FUNCTION token_floor_at(bigint);
DROP FUNCTION raise_no_epoch();
DROP TABLE store_epoch;
