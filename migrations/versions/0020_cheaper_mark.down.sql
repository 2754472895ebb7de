-- pgstore 0020, downgrade: written by make revision from sql/; 0020_cheaper_mark.py says what and why.

CREATE OR REPLACE FUNCTION job_mark_dispatched_many(p_run_ids text[], p_holder text, p_worker_ids text[], p_lease_sequences bigint[] DEFAULT NULL::bigint[])
 RETURNS TABLE(run_id text, cancelled boolean, recorded boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
$function$;
