-- pgstore 0020, upgrade: written by make revision from sql/; 0020_cheaper_mark.py says what and why.

CREATE OR REPLACE FUNCTION job_mark_dispatched_many(
    p_run_ids text[], p_holder text, p_worker_ids text[],
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_worker_ids jsonb;       -- run_id -> worker_id
    v_fences     jsonb;       -- run_id -> lease_sequence; NULL when no array is given
    v_ids        text[];      -- the jobs the UPDATE recorded
    v_flags      boolean[];   -- and their cancelled flags
    v_marked     jsonb;       -- run_id -> cancelled, when some job was not recorded
BEGIN
    PERFORM check_primary();
    -- Well-formed input costs one pass over the arrays, with no sort: every
    -- rule but "distinct" at once. Any doubt runs the checks one by one, in
    -- their order, for the first rule broken and its message. Distinct run ids
    -- are proven below, for free, when every job was recorded; otherwise
    -- check_run_ids raises for a repeat after the UPDATE, and the raise undoes
    -- it (nothing changes).
    IF p_run_ids IS NULL OR array_ndims(p_run_ids) > 1 OR cardinality(p_run_ids) > batch_max()
       OR p_holder IS NULL OR p_holder = '' OR length(p_holder) > 1024
       OR p_worker_ids IS NULL OR array_ndims(p_worker_ids) > 1
       OR cardinality(p_worker_ids) <> cardinality(p_run_ids)
       OR (p_lease_sequences IS NOT NULL
           AND (array_ndims(p_lease_sequences) > 1
                OR cardinality(p_lease_sequences) <> cardinality(p_run_ids)))
       OR EXISTS (SELECT FROM unnest(p_run_ids, p_worker_ids, p_lease_sequences) AS u(r, w, s)
                   WHERE r IS NULL OR r = '' OR length(r) > 1024 OR length(w) > 1024
                      OR s <= 0) THEN
        PERFORM check_run_ids(p_run_ids);
        PERFORM check_name('holder', p_holder);
        PERFORM check_same_length('worker_ids', p_worker_ids, cardinality(p_run_ids));
        IF EXISTS (SELECT FROM unnest(p_worker_ids) AS u(w) WHERE length(w) > 1024) THEN
            PERFORM raise_invalid('worker_ids must hold strings of at most 1024 characters');
        END IF;
        PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    END IF;

    -- Each job's own arguments are looked up by run_id in a jsonb object, not
    -- joined to the rows: jsonb keeps an object's keys sorted, so ->> is a
    -- binary search, and the call's cost grows with the batch, not with its
    -- square, whatever plan the planner picks. (Until pgstore_0013 they were
    -- a join with unnest(), which the generic plan plpgsql caches after five
    -- calls, estimating 10 input rows and 1 match, ran as a nested loop that
    -- rescanned the whole input for every job: "Rows Removed by Join Filter:
    -- 9900" for 100 jobs. A hash join, forced, costs as much as the lookups.)
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
    --
    -- The clock is read once, by the first row the statement writes (an
    -- InitPlan, not now_ms()'s numeric arithmetic for every job): that row's
    -- write then takes the transaction's id, so, as with a clock read for
    -- each row, no job gets a finished_at older than the moment this
    -- transaction became visible as running (what job_history_advance's
    -- proposals wait on).
    WITH marked AS (
        UPDATE jobs j
           SET dispatched = true,
               worker_id = v_worker_ids ->> j.run_id,
               finished_at = coalesce(j.finished_at, (SELECT now_ms()))
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
        RETURNING j.run_id, j.cancelled)
    SELECT array_agg(m.run_id), array_agg(m.cancelled)
      INTO v_ids, v_flags  -- NULL when nothing was recorded
      FROM marked m;

    -- One row per job, in the order given. Every job recorded (each row is
    -- updated once, so as many rows as run ids means they are distinct) and
    -- none cancelled, the common case: (run_id, false, true) for each, with
    -- no lookup.
    IF cardinality(v_ids) = cardinality(p_run_ids) THEN
        IF array_position(v_flags, true) IS NULL THEN
            RETURN QUERY SELECT u.run_id, false, true FROM unnest(p_run_ids) AS u(run_id);
            RETURN;
        END IF;
    ELSE
        PERFORM check_run_ids(p_run_ids);  -- a repeated run_id raises here
    END IF;

    -- Otherwise a recorded job answers the flag its UPDATE returned. The others
    -- (another holder or lease took the job, or it is gone) answer the stored
    -- flag, read as job_mark_dispatched reads it: by a statement of its own
    -- after the UPDATE (under READ COMMITTED, as committed by then), through
    -- the primary key; false for a missing job.
    v_marked := jsonb_object(v_ids, v_flags::text[]);
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

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
