-- pgstore 0013, upgrade: the batch calls cost about the same per job at any
-- batch size. Same signatures, same answers, same rules; CREATE OR REPLACE
-- keeps each function's owner, grants and comment. No table changes.
--
-- * job_mark_dispatched_many and job_renew_many look each job's worker id
--   and fence up by run_id in jsonb objects (a binary search), and build
--   their answer the same way, instead of joining the unnest() of the input
--   arrays to the rows: in the generic plan plpgsql caches after five calls
--   that join was a nested loop rescanning the whole input for every job
--   (quadratic in the batch). The jobs mark_dispatched_many does not record
--   answer their stored cancelled flag read by a statement after the UPDATE,
--   as job_mark_dispatched reads it.
-- * job_lease_many reads token_floor() (the WAL position's timeline) once per
--   call instead of once per leased row.

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
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
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
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = p_holder,
               lease_until = v_until,
               lease_sequence = greatest(j.lease_sequence + 1, v_floor),
               attempts = j.attempts + 1
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
    SELECT l.* FROM leased l ORDER BY l.dispatch_at, l.run_id;
END
$$;

CREATE OR REPLACE FUNCTION job_mark_dispatched_many(
    p_run_ids text[], p_holder text, p_worker_ids text[],
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_worker_ids jsonb;  -- run_id -> worker_id
    v_fences     jsonb;  -- run_id -> lease_sequence; NULL when no array is given
    v_marked     jsonb;  -- run_id -> cancelled, for the jobs the UPDATE recorded
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_name('holder', p_holder);
    PERFORM check_same_length('worker_ids', p_worker_ids, cardinality(p_run_ids));
    IF EXISTS (SELECT FROM unnest(p_worker_ids) AS u(w) WHERE length(w) > 1024) THEN
        PERFORM raise_invalid('worker_ids must hold strings of at most 1024 characters');
    END IF;
    PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));

    -- Each job's own arguments are looked up by run_id in a jsonb object, not
    -- joined to the rows: jsonb keeps an object's keys sorted, so ->> is a
    -- binary search, and the call's cost grows with the batch, not with its
    -- square, whatever plan the planner picks. (Until pgstore_0013 they were
    -- a join with unnest(), which the generic plan plpgsql caches after five
    -- calls, estimating 10 input rows and 1 match, ran as a nested loop that
    -- rescanned the whole input for every job: "Rows Removed by Join Filter:
    -- 9900" for 100 jobs.)
    -- jsonb_object() is strict: no p_lease_sequences, no v_fences.
    v_worker_ids := jsonb_object(p_run_ids, p_worker_ids);
    v_fences := jsonb_object(p_run_ids, p_lease_sequences::text[]);

    -- job_mark_dispatched's UPDATE for every job at once, and its race rule:
    -- under READ COMMITTED a concurrent job_cancel either committed before this
    -- UPDATE took the row lock (the re-checked row then says cancelled, and
    -- RETURNING reports that row's flag) or waits for it and then sees the job
    -- dispatched. The rows are reached through the primary key (= ANY). A job
    -- without a fence (no array, or a NULL element) compares lease_sequence,
    -- which is NOT NULL, with itself.
    WITH marked AS (
        UPDATE jobs j
           SET dispatched = true,
               worker_id = v_worker_ids ->> j.run_id,
               finished_at = coalesce(j.finished_at, now_ms())
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
        RETURNING j.run_id, j.cancelled)
    SELECT jsonb_object(array_agg(m.run_id), array_agg(m.cancelled::text))
      INTO v_marked  -- NULL when nothing was recorded
      FROM marked m;

    -- One row per job, in the order given. A recorded job answers the flag its
    -- UPDATE returned. The others (another holder or lease took the job, or it
    -- is gone) answer the stored flag, read as job_mark_dispatched reads it: by
    -- a statement of its own after the UPDATE (under READ COMMITTED, as
    -- committed by then), through the primary key; false for a missing job.
    RETURN QUERY
    SELECT u.run_id,
           coalesce((v_marked ->> u.run_id)::boolean,
                    (SELECT s.cancelled FROM jobs s WHERE s.run_id = u.run_id),
                    false),
           (v_marked ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

CREATE OR REPLACE FUNCTION job_renew_many(
    p_run_ids text[], p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, renewed boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_fences  jsonb;  -- run_id -> lease_sequence; NULL when no array is given
    v_renewed jsonb;  -- run_id -> true, for the leases the UPDATE extended
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- As job_mark_dispatched_many: the fences looked up by run_id in a jsonb
    -- object (a binary search), not joined, so the call's cost grows with the
    -- batch, not with its square, in any plan; the rows reached through the
    -- primary key.
    v_fences := jsonb_object(p_run_ids, p_lease_sequences::text[]);

    WITH renewed AS (
        UPDATE jobs j
           SET lease_until = v_until
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_until > v_now
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
        RETURNING j.run_id)
    SELECT jsonb_object(array_agg(r.run_id), array_agg('true'::text))
      INTO v_renewed  -- NULL when no lease was extended
      FROM renewed r;

    RETURN QUERY
    SELECT u.run_id, (v_renewed ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0013'::text $$;
