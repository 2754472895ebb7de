-- pgstore: what an operator (or a monitoring role) reads.
--
-- Functions that read both stores (store_stats also moves its own bookkeeping
-- row, job_history, forward), so the command line, a metrics exporter or a
-- dashboard in any language reads the same numbers through the same
-- privileges as the API: none of them needs SELECT on the tables. Every time
-- is judged against one instant (p_now, NULL meaning now_ms()), and each
-- answer is one statement, so its numbers come from one snapshot.

-- The history counts (dispatched, recalled, cancelled, failed) never scan the
-- history: they cost one row and the jobs finished in the last seconds, however
-- long the history. Every finished job is exactly one kind: dispatched (and not
-- cancelled), recalled (dispatched and cancelled: a cancel racing a dispatch),
-- cancelled (not dispatched) or failed (neither). So:
-- * every finished job is counted once, when it is old enough, into
--   job_history: how many jobs finished before job_history.upto (finished_at <
--   upto), and how many of them are of each kind but cancelled (which is the
--   rest). store_stats adds the jobs that finished since (finished_at >= upto: a
--   range of the finished jobs' index, counted by kind).
-- * A finished job stays finished, and of its kind, until it is deleted, but
--   for three rare moves: job_retry (a failed job waits again), job_cancel of a
--   failed job (it counts as cancelled) and job_mark_dispatched of a cancelled
--   one (a recall). job_purge and those three tell job_history_move, after their
--   own write, which moves a job already counted (finished_at < upto) out of its
--   kind; a job finished since is counted as it is at every call.
-- The common write path of a job (lease, renew, release, the mark of a job not
-- cancelled, the cancel of a job not failed) never touches job_history: only
-- those rare moves lock its row, for a moment. job_history_advance moves upto
-- forward only past jobs whose finish has certainly committed (see there).

CREATE TABLE job_history (
    one           boolean PRIMARY KEY DEFAULT true CHECK (one),
    upto          bigint NOT NULL,
    finished      bigint NOT NULL CHECK (finished >= 0),
    dispatched    bigint NOT NULL CHECK (dispatched >= 0),
    next_upto     bigint,
    next_snapshot pg_snapshot,
    recalled      bigint NOT NULL DEFAULT 0 CHECK (recalled >= 0),
    failed        bigint NOT NULL DEFAULT 0 CHECK (failed >= 0)
);

INSERT INTO job_history (upto, finished, dispatched) VALUES (-9223372036854775808, 0, 0);

COMMENT ON TABLE job_history IS
'One row: the jobs that finished before upto (finished_at < upto) counted once, so '
'store_stats reads only the jobs that finished since. Written by job_history_advance '
'(called by store_stats) and job_history_move (job_purge, job_retry, job_cancel of a '
'failed job, job_mark_dispatched(_many) of a cancelled one); no one else may write it. Starts at the smallest bigint: the first store_stats calls '
'count the whole history once.';
COMMENT ON COLUMN job_history.finished IS
'How many jobs with finished_at < upto exist (dispatched, cancelled or failed).';
COMMENT ON COLUMN job_history.dispatched IS
'How many of them are dispatched and not cancelled.';
COMMENT ON COLUMN job_history.recalled IS
'How many of them are dispatched and cancelled (recalled).';
COMMENT ON COLUMN job_history.failed IS
'How many of them are failed, and neither cancelled nor dispatched. The cancelled are '
'the rest: finished - dispatched - recalled - failed.';
COMMENT ON COLUMN job_history.next_upto IS
'The upto proposed by the last job_history_advance: taken once every transaction '
'running at next_snapshot has ended.';
COMMENT ON COLUMN job_history.next_snapshot IS
'pg_current_snapshot() when next_upto was proposed.';

CREATE FUNCTION job_history_advance() RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_upto bigint;
    v_next bigint;
    v_snap pg_snapshot;
    v_lag  bigint;
BEGIN
    -- Only where it can write, and under READ COMMITTED, where each statement
    -- below reads a snapshot taken after the row lock.
    IF pg_is_in_recovery()
       OR current_setting('transaction_read_only') = 'on'
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    -- finished_at is the clock when the finishing statement ran, not when its
    -- transaction commits: a job can become visible with a finished_at below an
    -- upto already taken. So an upto is proposed first (the clock less a second,
    -- read before the snapshot) and taken only once every transaction that was
    -- running at that snapshot has ended: a transaction that had no xid then
    -- finishes jobs at a later clock. A proposal is made once upto is ten seconds
    -- behind (the setting pgstore.stats_lag_ms, in a session, changes that), so a
    -- call writes (and commits durably) at most about once per ten seconds
    -- whatever the rate of calls; the others only read the row.
    v_lag := coalesce(nullif(current_setting('pgstore.stats_lag_ms', true), '')::bigint, 10000);
    SELECT h.upto, h.next_upto, h.next_snapshot INTO v_upto, v_next, v_snap
      FROM job_history h;
    IF v_snap IS NULL AND v_upto > now_ms() - 1000 - v_lag THEN
        RETURN;  -- recent enough
    ELSIF v_snap IS NOT NULL AND EXISTS (
              SELECT FROM pg_snapshot_xip(v_snap) AS x(xid)
               WHERE pg_xact_status(x.xid) IS NOT DISTINCT FROM 'in progress') THEN
        RETURN;  -- the proposal waits for those transactions
    END IF;
    -- One advance at a time; never wait (another call is at it, or a
    -- job_history_move holds the row for a moment). The row as it is now:
    -- another call may have moved it since the read above.
    SELECT h.upto, h.next_upto, h.next_snapshot INTO v_upto, v_next, v_snap
      FROM job_history h
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_snap IS NULL THEN
        IF v_upto <= now_ms() - 1000 - v_lag THEN
            v_next := now_ms() - 1000;
            UPDATE job_history
               SET next_upto = v_next, next_snapshot = pg_current_snapshot();
        END IF;
    ELSIF NOT EXISTS (
              SELECT FROM pg_snapshot_xip(v_snap) AS x(xid)
               WHERE pg_xact_status(x.xid) IS NOT DISTINCT FROM 'in progress') THEN
        UPDATE job_history h
           SET upto = v_next,
               finished = h.finished + c.finished,
               dispatched = h.dispatched + c.dispatched,
               recalled = h.recalled + c.recalled,
               failed = h.failed + c.failed,
               next_upto = NULL,
               next_snapshot = NULL
          FROM (SELECT count(*) AS finished,
                       count(*) FILTER (WHERE j.dispatched AND NOT j.cancelled) AS dispatched,
                       count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                       count(*) FILTER (WHERE j.failed AND NOT j.cancelled
                                          AND NOT j.dispatched) AS failed
                  FROM jobs j
                 WHERE j.finished_at IS NOT NULL
                   AND j.finished_at >= v_upto
                   AND j.finished_at < v_next) AS c;
    END IF;
END
$$;

COMMENT ON FUNCTION job_history_advance() IS
'Moves job_history.upto to its next_upto, adding the jobs that finished in between '
'(by kind), '
'once every transaction running when next_upto was proposed has ended; proposes the '
'next (now_ms() less a second) once upto is ten seconds behind (pgstore.stats_lag_ms, '
'a session setting, in ms, changes that). Writes only then (at most about once per '
'ten seconds); otherwise it reads the row. Does nothing on a '
'standby, in a read-only or not READ COMMITTED transaction, or while another call '
'holds the row. Internal: store_stats calls it.';

CREATE FUNCTION job_history_move(p_finished_at bigint[], p_from text[], p_to text[])
RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_upto bigint;
BEGIN
    IF cardinality(p_finished_at) IS NOT DISTINCT FROM 0 OR p_finished_at IS NULL THEN
        RETURN;
    END IF;
    -- Called after the caller changed its rows: waits for a running advance and
    -- then reads its upto, so a job the advance counted (as it was before the
    -- caller's uncommitted change) is moved again; and holds the row to commit,
    -- so no advance counts the job until the change is visible.
    SELECT h.upto INTO v_upto FROM job_history h FOR UPDATE;
    UPDATE job_history h
       SET finished = h.finished - c.gone,
           dispatched = h.dispatched + c.dispatched,
           recalled = h.recalled + c.recalled,
           failed = h.failed + c.failed
      FROM (SELECT count(*) AS moved,
                   count(*) FILTER (WHERE u.t IS NULL) AS gone,
                   count(*) FILTER (WHERE u.t = 'dispatched')
                     - count(*) FILTER (WHERE u.f = 'dispatched') AS dispatched,
                   count(*) FILTER (WHERE u.t = 'recalled')
                     - count(*) FILTER (WHERE u.f = 'recalled') AS recalled,
                   count(*) FILTER (WHERE u.t = 'failed')
                     - count(*) FILTER (WHERE u.f = 'failed') AS failed
              FROM unnest(p_finished_at, p_from, p_to) AS u(at, f, t)
             WHERE u.at < v_upto) AS c
     WHERE c.moved > 0;
END
$$;

COMMENT ON FUNCTION job_history_move(bigint[], text[], text[]) IS
'Moves jobs already counted in job_history (finished_at < upto) from one kind to '
'another: p_finished_at[i] the finished_at of each (NULL: never finished, nothing to '
'move), p_from[i] its kind before (''dispatched'': not cancelled, ''recalled'', '
'''cancelled'' or ''failed''), p_to[i] its kind now (NULL, or p_to NULL: no longer '
'finished: deleted, or retried). Only those with finished_at < upto were counted; the '
'others are counted as they are by store_stats. Internal: job_purge, job_retry, '
'job_cancel (of a failed job) and job_mark_dispatched(_many) (of a cancelled one) call '
'it, after their own write.';

CREATE FUNCTION store_stats_read(p_now bigint)
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
SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0
AS $$
-- Runs as its caller, store_stats (as the store's owner, on its pinned
-- search_path), within the caller's statement and snapshot. Planned once a
-- session (plan_cache_mode = force_generic_plan): planning this statement cost
-- several times what running it costs, at every call. Never in parallel: the
-- planner guesses the waiting jobs from the whole table's statistics (tens of
-- thousands in a long history, where a few wait), and on PostgreSQL 18 a
-- parallel count's workers cost some ms to start, more than the count. In that generic plan
-- job_history.upto is unknown (a subquery): the finished jobs' range has an
-- upper end, always true, so that the planner guesses a narrow range (0.5% of
-- the table, not the third an open range gets) and walks the index, not the
-- history. (Until pgstore_0028 the statement was store_stats' own, given an
-- earlier reading of upto as a known value and planned anew at each call, until
-- plpgsql turned to a generic plan for good, as it does when a session's first
-- plans cost as much: when they counted a history that job_history had not yet
-- passed. That generic plan walked the whole history at every call.)
BEGIN
    -- The waiting jobs' WHERE is the partial index's predicate, so that part and
    -- the oldest due job read only the jobs still waiting (the same walk
    -- job_lease makes). The history counts read job_history and the jobs
    -- finished since its upto (the finished jobs' index), each by kind: every
    -- finished job is exactly one of dispatched and not cancelled, recalled,
    -- cancelled (not dispatched) or failed (neither), so cancelled is the rest. A
    -- schedule is due and unclaimed, when not paused, from the later of due_at
    -- (its jittered occurrence, or a pending trigger) and an expired lease's end:
    -- what schedule_claim_due compares. A job of a paused queue is not due
    -- (job_lease would not take it): it counts as pending, and is never the
    -- oldest due job, so a deliberate pause raises no lag alert.
    RETURN QUERY
    SELECT p_now,
           s.total, s.due, s.leased, s.done, os.id, os.since,
           w.pending, w.due, w.due_expired, w.leased,
           f.dispatched_only + f.recalled, f.recalled,
           f.finished - f.dispatched_only - f.recalled - f.failed, f.failed,
           oj.run_id, oj.dispatch_at
      FROM (SELECT count(*) AS total,
                   count(*) FILTER (WHERE NOT sc.paused
                                      AND sc.due_at <= p_now
                                      AND (sc.lease_until IS NULL OR sc.lease_until <= p_now))
                     AS due,
                   count(*) FILTER (WHERE sc.lease_until > p_now) AS leased,
                   count(*) FILTER (WHERE sc.next_run_at IS NULL) AS done
              FROM schedules sc) AS s
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE (j.dispatch_at > p_now OR j.paused)
                                      AND (j.lease_until IS NULL OR j.lease_until <= p_now))
                     AS pending,
                   count(*) FILTER (WHERE j.dispatch_at <= p_now AND NOT j.paused
                                      AND (j.lease_until IS NULL OR j.lease_until <= p_now))
                     AS due,
                   count(*) FILTER (WHERE j.dispatch_at <= p_now AND NOT j.paused
                                      AND j.lease_until <= p_now)
                     AS due_expired,
                   count(*) FILTER (WHERE j.lease_until > p_now) AS leased
              FROM (SELECT d.dispatch_at, d.lease_until,
                           coalesce((SELECT p.paused FROM queues p WHERE p.queue = 'default'),
                                    false) AS paused
                      FROM jobs d
                     WHERE NOT d.dispatched AND NOT d.cancelled AND NOT d.failed
                       AND d.queue = 'default' AND d.priority = 0
                    UNION ALL
                    SELECT q.dispatch_at, q.lease_until, coalesce(p.paused, false)
                      FROM jobs q
                      LEFT JOIN queues p ON p.queue = q.queue
                     WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                       AND (q.queue <> 'default' OR q.priority <> 0)) AS j) AS w
     CROSS JOIN
           (SELECT k.finished + d.finished AS finished,
                   k.dispatched + d.dispatched AS dispatched_only,
                   k.recalled + d.recalled AS recalled,
                   k.failed + d.failed AS failed
              FROM job_history k
             CROSS JOIN
                   (SELECT count(*) AS finished,
                           count(*) FILTER (WHERE j.dispatched AND NOT j.cancelled)
                             AS dispatched,
                           count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                           count(*) FILTER (WHERE j.failed AND NOT j.cancelled
                                              AND NOT j.dispatched) AS failed
                      FROM jobs j
                     WHERE j.finished_at IS NOT NULL
                       AND j.finished_at >= (SELECT k2.upto FROM job_history k2)
                       AND j.finished_at <= 9223372036854775807) AS d) AS f
      LEFT JOIN LATERAL
           (SELECT sc.id, greatest(sc.due_at, sc.lease_until) AS since
              FROM schedules sc
             WHERE NOT sc.paused
               AND sc.due_at <= p_now
               AND (sc.lease_until IS NULL OR sc.lease_until <= p_now)
             ORDER BY greatest(sc.due_at, sc.lease_until), sc.id
             LIMIT 1) AS os ON true
      LEFT JOIN LATERAL
           (SELECT o.run_id, o.dispatch_at
              FROM ((SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND j.queue = 'default' AND j.priority = 0
                        AND j.dispatch_at <= p_now
                        AND (j.lease_until IS NULL OR j.lease_until <= p_now)
                        AND NOT EXISTS (SELECT FROM queues p
                                         WHERE p.queue = 'default' AND p.paused)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)
                    UNION ALL
                    (SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND (j.queue <> 'default' OR j.priority <> 0)
                        AND j.dispatch_at <= p_now
                        AND (j.lease_until IS NULL OR j.lease_until <= p_now)
                        AND NOT EXISTS (SELECT FROM queues p
                                         WHERE p.queue = j.queue AND p.paused)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)) AS o
             ORDER BY o.dispatch_at, o.run_id
             LIMIT 1) AS oj ON true;
END
$$;

COMMENT ON FUNCTION store_stats_read(bigint) IS
'store_stats'' one statement: its row of gauges at p_now (not NULL), the history counts '
'read from job_history and the jobs finished since its upto. Internal: store_stats '
'calls it, after moving job_history forward.';

CREATE FUNCTION store_stats(p_now bigint DEFAULT NULL)
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
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now  bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- VOLATILE: on a primary it first moves job_history forward (a separate
    -- statement that never waits); the gauges below are one statement, so one
    -- snapshot, which sees that move.
    PERFORM job_history_advance();
    RETURN QUERY SELECT * FROM store_stats_read(v_now);
END
$$;

COMMENT ON FUNCTION store_stats(bigint) IS
'One row of gauges at p_now (NULL: now_ms()), from one snapshot. Schedules: how many, '
'how many due and unclaimed (not paused, due_at <= now, no live lease: what '
'schedule_claim_due would take), under a live lease, '
'one-shots done (tombstones), and the one claimable longest (its id, and since when: the '
'later of due_at and an expired lease''s end). Jobs, each in exactly one state: '
'pending (waiting, no live lease, not due or its queue paused), due (waiting, due, no '
'live lease, queue not paused: what '
'job_lease would take; jobs_due_expired_lease of them after an expired lease), leased '
'(waiting, live lease), dispatched (jobs_recalled of them cancelled meanwhile), '
'cancelled (never dispatched), failed (out of attempts, not cancelled); and the oldest '
'due job (its run_id and dispatch_at). '
'The waiting counts read the two pending indexes; the history counts read job_history '
'and the jobs finished since its upto, never the rest of the history, whatever its length '
'(the schedules are scanned). On a primary, under READ '
'COMMITTED and not read-only, it first moves job_history forward '
'(job_history_advance): VOLATILE, and it may write that one row.';

CREATE FUNCTION job_list(
    p_filter text, p_now bigint, p_limit integer, p_queues text[] DEFAULT NULL
)
RETURNS TABLE (
    run_id       text,
    dispatch_at  bigint,
    lease_holder text,
    lease_until  bigint,
    worker_id    text,
    dispatched   boolean,
    cancelled    boolean,
    lease_sequence bigint,
    finished_at  bigint,
    attempts     integer,
    max_attempts integer,
    last_error   text,
    failed       boolean,
    queue        text,
    priority     integer,
    payload      jsonb,
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
    PERFORM check_queues(p_queues);
    IF p_limit IS NOT NULL THEN
        PERFORM check_positive('limit', p_limit);
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- One static statement per filter, so each gets its own plan ('due' walks the
    -- pending index). count(*) OVER () counts every matching job before the LIMIT.
    IF p_filter = 'due' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM (SELECT d.*
                  FROM jobs d
                 WHERE NOT d.dispatched AND NOT d.cancelled AND NOT d.failed
                   AND d.queue = 'default' AND d.priority = 0
                   AND d.dispatch_at <= v_now
                   AND (p_queues IS NULL OR d.queue = ANY (p_queues))
                UNION ALL
                SELECT q.*
                  FROM jobs q
                 WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                   AND (q.queue <> 'default' OR q.priority <> 0)
                   AND q.dispatch_at <= v_now
                   AND (p_queues IS NULL OR q.queue = ANY (p_queues))) AS j
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'dispatched' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM jobs j
         WHERE j.dispatched
           AND (p_queues IS NULL OR j.queue = ANY (p_queues))
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'failed' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM jobs j
         WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched
           AND (p_queues IS NULL OR j.queue = ANY (p_queues))
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM jobs j
         WHERE p_queues IS NULL OR j.queue = ANY (p_queues)
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$$;

COMMENT ON FUNCTION job_list(text, bigint, integer, text[]) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects in the queues p_queues (NULL, the default: every queue), with the columns of the jobs table in its order, each row then carrying how '
'many match in all (matching). p_filter: ''all''; '
'''due'' (waiting and due at p_now, NULL meaning now_ms(), leased or not); '
'''dispatched''; ''failed'' (out of attempts and not cancelled: what job_retry takes '
'back). The operator''s view of the table (pgstore jobs); 22023 for another '
'filter, a p_limit that is not positive, or p_queues not NULL nor a non-empty array of '
'queue names.';
