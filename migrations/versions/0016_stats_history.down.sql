-- pgstore 0014, downgrade: back to pgstore_0013's store_stats (STABLE, scanning
-- the history), job_list without finished_at, and job_retry, job_remove and
-- job_purge without job_history_forget; job_history, its helpers and the
-- index of recalled and failed jobs is dropped. No job row changes.

CREATE OR REPLACE FUNCTION job_retry(p_run_id text, p_dispatch_at bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    v_at := coalesce(p_dispatch_at, now_ms());

    UPDATE jobs j
       SET failed = false,
           attempts = 0,
           dispatch_at = v_at,
           finished_at = NULL
     WHERE j.run_id = p_run_id
       AND j.failed
       AND NOT j.cancelled
       AND NOT j.dispatched;
    IF FOUND THEN
        PERFORM pg_notify(job_channel(), v_at::text);
        RETURN 'retried';
    ELSIF EXISTS (SELECT FROM jobs j WHERE j.run_id = p_run_id) THEN
        RETURN 'not_failed';
    END IF;
    RETURN 'missing';
END
$$;

CREATE OR REPLACE FUNCTION job_remove(p_run_id text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_job jobs;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- Granted to the client role, so it must not erase what was dispatched (the
    -- owner's job_purge deletes history), nor a job a dispatcher may still be
    -- dispatching: one with a lease holder, even an expired one (a dispatch can
    -- outlive its lease, and its mark must then find the row). The row lock, as
    -- in job_cancel, orders this call against a concurrent lease or mark: it
    -- waits for that commit and then decides on the newest row.
    SELECT * INTO v_job FROM jobs j WHERE j.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_job.dispatched OR v_job.cancelled OR v_job.failed
       OR v_job.lease_holder IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = format(
                'job %s is %s: job_remove deletes only a waiting job that holds no lease',
                quote_literal(p_run_id),
                CASE WHEN v_job.dispatched THEN 'dispatched'
                     WHEN v_job.cancelled THEN 'cancelled'
                     WHEN v_job.failed THEN 'failed'
                     ELSE format('leased by %s (lease_sequence %s; a dispatch may be running)',
                                 quote_literal(v_job.lease_holder), v_job.lease_sequence)
                END),
            HINT = 'Cancel it with job_cancel instead; the schema''s owner deletes finished '
                   'jobs with job_purge.';
    END IF;

    -- One statement: the delete and the fence it raises (never lowers).
    WITH gone AS (
        DELETE FROM jobs j WHERE j.run_id = p_run_id RETURNING j.lease_sequence)
    UPDATE job_fences f
       SET lease_sequence = g.lease_sequence
      FROM gone g
     WHERE g.lease_sequence > f.lease_sequence;
END
$$;

CREATE OR REPLACE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_deleted bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_present('before', p_before);
    IF p_before < 0 THEN
        PERFORM raise_invalid('before must be a non-negative integer');
    END IF;
    PERFORM check_positive('limit', p_limit);
    v_now := now_ms();

    -- One statement. The walk reads the finished jobs' index, oldest first,
    -- and locks what it deletes, skipping rows a concurrent call holds locked
    -- (it never waits on a lease or a mark). A locked row is re-checked in its
    -- newest version, so a job whose lease is live (a dispatcher still holds
    -- a cancelled or dispatched job) is kept; a waiting job has no finished_at.
    --
    -- The same statement raises job_fences to the greatest lease_sequence it
    -- deleted (never lowers it): a run_id scheduled again is leased above it.
    -- Only a purge that raises the mark writes its row, so two such purges (or
    -- a purge and a job_remove) take turns on it until the first commits.
    WITH gone AS (
        DELETE FROM jobs j
         WHERE j.run_id IN (
                   SELECT c.run_id
                     FROM jobs c
                    WHERE c.finished_at IS NOT NULL
                      AND c.finished_at < p_before
                      AND (c.dispatched OR c.cancelled OR c.failed)
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.finished_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED)
        RETURNING j.lease_sequence),
    fenced AS (
        UPDATE job_fences f
           SET lease_sequence = g.top
          FROM (SELECT max(d.lease_sequence) AS top FROM gone d) g
         WHERE g.top > f.lease_sequence)
    SELECT count(*) INTO v_deleted FROM gone;
    RETURN v_deleted;
END
$$;

CREATE OR REPLACE FUNCTION store_stats(p_now bigint DEFAULT NULL)
RETURNS TABLE (
    now                     bigint,
    schedules               bigint,
    schedules_due           bigint,
    schedules_leased        bigint,
    schedules_done          bigint,
    oldest_due_schedule_id  text,
    oldest_due_schedule_since bigint,
    jobs_pending            bigint,
    jobs_due                bigint,
    jobs_due_expired_lease  bigint,
    jobs_leased             bigint,
    jobs_dispatched         bigint,
    jobs_recalled           bigint,
    jobs_cancelled          bigint,
    jobs_failed             bigint,
    oldest_due_job_id       text,
    oldest_due_job_at       bigint
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- The waiting jobs' WHERE is the partial index's predicate, so that part and
    -- the oldest due job read only the jobs still waiting (the same walk
    -- job_lease makes); the history counts scan the table. A schedule is due
    -- and unclaimed from the later of next_run_at and an expired lease's end.
    RETURN QUERY
    SELECT v_now,
           s.total, s.due, s.leased, s.done, os.id, os.since,
           w.pending, w.due, w.due_expired, w.leased,
           h.dispatched, h.recalled, h.cancelled, h.failed,
           oj.run_id, oj.dispatch_at
      FROM (SELECT count(*) AS total,
                   count(*) FILTER (WHERE sc.next_run_at <= v_now
                                      AND (sc.lease_until IS NULL OR sc.lease_until <= v_now))
                     AS due,
                   count(*) FILTER (WHERE sc.lease_until > v_now) AS leased,
                   count(*) FILTER (WHERE sc.next_run_at IS NULL) AS done
              FROM schedules sc) AS s
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE j.dispatch_at > v_now
                                      AND (j.lease_until IS NULL OR j.lease_until <= v_now))
                     AS pending,
                   count(*) FILTER (WHERE j.dispatch_at <= v_now
                                      AND (j.lease_until IS NULL OR j.lease_until <= v_now))
                     AS due,
                   count(*) FILTER (WHERE j.dispatch_at <= v_now AND j.lease_until <= v_now)
                     AS due_expired,
                   count(*) FILTER (WHERE j.lease_until > v_now) AS leased
              FROM jobs j
             WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed) AS w
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE j.dispatched) AS dispatched,
                   count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                   count(*) FILTER (WHERE j.cancelled AND NOT j.dispatched) AS cancelled,
                   count(*) FILTER (WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched)
                     AS failed
              FROM jobs j
             WHERE j.dispatched OR j.cancelled OR j.failed) AS h
      LEFT JOIN LATERAL
           (SELECT sc.id, greatest(sc.next_run_at, sc.lease_until) AS since
              FROM schedules sc
             WHERE sc.next_run_at <= v_now
               AND (sc.lease_until IS NULL OR sc.lease_until <= v_now)
             ORDER BY greatest(sc.next_run_at, sc.lease_until), sc.id
             LIMIT 1) AS os ON true
      LEFT JOIN LATERAL
           (SELECT j.run_id, j.dispatch_at
              FROM jobs j
             WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
               AND j.dispatch_at <= v_now
               AND (j.lease_until IS NULL OR j.lease_until <= v_now)
             ORDER BY j.dispatch_at, j.run_id
             LIMIT 1) AS oj ON true;
END
$$;

COMMENT ON FUNCTION store_stats(bigint) IS
'One row of gauges at p_now (NULL: now_ms()), from one snapshot. Schedules: how many, '
'how many due and unclaimed (next_run_at <= now, no live lease), under a live lease, '
'one-shots done (tombstones), and the one claimable longest (its id, and since when: the '
'later of next_run_at and an expired lease''s end). Jobs, each in exactly one state: '
'pending (waiting, not due, no live lease), due (waiting, due, no live lease: what '
'job_lease would take; jobs_due_expired_lease of them after an expired lease), leased '
'(waiting, live lease), dispatched (jobs_recalled of them cancelled meanwhile), '
'cancelled (never dispatched), failed (out of attempts, not cancelled); and the oldest '
'due job (its run_id and dispatch_at). '
'The waiting counts read the pending index; the history counts and the schedules scan '
'their tables (about 0.1 s a million rows).';

DROP FUNCTION job_list(text, bigint, integer);

CREATE FUNCTION job_list(p_filter text, p_now bigint, p_limit integer)
RETURNS TABLE (
    run_id       text,
    dispatch_at  bigint,
    lease_holder text,
    lease_until  bigint,
    worker_id    text,
    dispatched   boolean,
    cancelled    boolean,
    lease_sequence bigint,
    attempts     integer,
    max_attempts integer,
    last_error   text,
    failed       boolean,
    matching     bigint
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM check_one_of('filter', p_filter, ARRAY['all', 'due', 'dispatched', 'failed']);
    IF p_limit IS NOT NULL THEN
        PERFORM check_positive('limit', p_limit);
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- One static statement per filter, so each gets its own plan ('due' walks the
    -- pending index). count(*) OVER () counts every matching job before the LIMIT.
    IF p_filter = 'due' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
           AND j.dispatch_at <= v_now
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'dispatched' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'failed' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$$;

COMMENT ON FUNCTION job_list(text, bigint, integer) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects, each row carrying how many match in all (matching). p_filter: ''all''; '
'''due'' (waiting and due at p_now, NULL meaning now_ms(), leased or not); '
'''dispatched''; ''failed'' (out of attempts and not cancelled: what job_retry takes '
'back). The operator''s view of the table (pgstore jobs); 22023 for another '
'filter or a p_limit that is not positive.';

REVOKE ALL ON FUNCTION job_list(text, bigint, integer) FROM PUBLIC;

DROP FUNCTION job_history_forget(bigint[], boolean[]);
DROP FUNCTION job_history_advance();
DROP TABLE job_history;
DROP INDEX jobs_recalled_or_failed;
