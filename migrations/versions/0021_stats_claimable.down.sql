-- pgstore 0021, downgrade: written by make revision from sql/; 0021_stats_claimable.py says what and why.

CREATE OR REPLACE FUNCTION store_stats(p_now bigint DEFAULT NULL::bigint)
 RETURNS TABLE(now bigint, schedules bigint, schedules_due bigint, schedules_leased bigint, schedules_done bigint, oldest_due_schedule_id text, oldest_due_schedule_since bigint, jobs_pending bigint, jobs_due bigint, jobs_due_expired_lease bigint, jobs_leased bigint, jobs_dispatched bigint, jobs_recalled bigint, jobs_cancelled bigint, jobs_failed bigint, oldest_due_job_id text, oldest_due_job_at bigint)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now  bigint;
    v_upto bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- VOLATILE: on a primary it first moves job_history forward (a separate
    -- statement that never waits); the gauges below are one statement, so one
    -- snapshot, which sees that move.
    PERFORM job_history_advance();
    -- upto only grows, so this earlier reading is a lower bound of the one the
    -- statement below reads: a known value, which lets the planner walk the
    -- finished jobs' index for the jobs finished since (the statement's own
    -- reading, a subquery, is known only when it runs).
    v_upto := (SELECT k.upto FROM job_history k);
    -- The waiting jobs' WHERE is the partial index's predicate, so that part and
    -- the oldest due job read only the jobs still waiting (the same walk
    -- job_lease makes). The history counts read job_history, the jobs finished
    -- since its upto (the finished jobs' index) and the recalled and failed
    -- jobs' partial index: every finished job is exactly one of dispatched
    -- and not cancelled, recalled, cancelled (not dispatched) or failed (neither),
    -- so cancelled is the rest. A schedule is due and unclaimed from the later of
    -- next_run_at and an expired lease's end.
    RETURN QUERY
    SELECT v_now,
           s.total, s.due, s.leased, s.done, os.id, os.since,
           w.pending, w.due, w.due_expired, w.leased,
           f.dispatched_only + r.recalled, r.recalled,
           f.finished - f.dispatched_only - r.recalled - r.failed, r.failed,
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
              FROM (SELECT d.dispatch_at, d.lease_until
                      FROM jobs d
                     WHERE NOT d.dispatched AND NOT d.cancelled AND NOT d.failed
                       AND d.queue = 'default' AND d.priority = 0
                    UNION ALL
                    SELECT q.dispatch_at, q.lease_until
                      FROM jobs q
                     WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                       AND (q.queue <> 'default' OR q.priority <> 0)) AS j) AS w
     CROSS JOIN
           (SELECT k.finished + d.finished AS finished,
                   k.dispatched + d.dispatched AS dispatched_only
              FROM job_history k
             CROSS JOIN
                   (SELECT count(*) AS finished,
                           count(*) FILTER (WHERE j.dispatched AND NOT j.cancelled)
                             AS dispatched
                      FROM jobs j
                     WHERE j.finished_at IS NOT NULL
                       AND j.finished_at >= v_upto
                       AND j.finished_at >= (SELECT k2.upto FROM job_history k2)) AS d) AS f
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE j.dispatched) AS recalled,
                   count(*) FILTER (WHERE NOT j.dispatched) AS failed
              FROM jobs j
             WHERE (j.dispatched AND j.cancelled)
                OR (j.failed AND NOT j.cancelled AND NOT j.dispatched)) AS r
      LEFT JOIN LATERAL
           (SELECT sc.id, greatest(sc.next_run_at, sc.lease_until) AS since
              FROM schedules sc
             WHERE sc.next_run_at <= v_now
               AND (sc.lease_until IS NULL OR sc.lease_until <= v_now)
             ORDER BY greatest(sc.next_run_at, sc.lease_until), sc.id
             LIMIT 1) AS os ON true
      LEFT JOIN LATERAL
           (SELECT o.run_id, o.dispatch_at
              FROM ((SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND j.queue = 'default' AND j.priority = 0
                        AND j.dispatch_at <= v_now
                        AND (j.lease_until IS NULL OR j.lease_until <= v_now)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)
                    UNION ALL
                    (SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND (j.queue <> 'default' OR j.priority <> 0)
                        AND j.dispatch_at <= v_now
                        AND (j.lease_until IS NULL OR j.lease_until <= v_now)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)) AS o
             ORDER BY o.dispatch_at, o.run_id
             LIMIT 1) AS oj ON true;
END
$function$;

COMMENT ON FUNCTION store_stats(bigint) IS
'One row of gauges at p_now (NULL: now_ms()), from one snapshot. Schedules: how '
'many, how many due and unclaimed (next_run_at <= now, no live lease), under a live '
'lease, one-shots done (tombstones), and the one claimable longest (its id, and '
'since when: the later of next_run_at and an expired lease''s end). Jobs, each in '
'exactly one state: pending (waiting, not due, no live lease), due (waiting, due, no '
'live lease: what job_lease would take; jobs_due_expired_lease of them after an '
'expired lease), leased (waiting, live lease), dispatched (jobs_recalled of them '
'cancelled meanwhile), cancelled (never dispatched), failed (out of attempts, not '
'cancelled); and the oldest due job (its run_id and dispatch_at). The waiting counts '
'read the two pending indexes; the history counts read job_history, the jobs '
'finished since its upto and the small index of recalled and failed jobs, never the '
'rest of the history (the schedules are scanned). On a primary, under READ COMMITTED '
'and not read-only, it first moves job_history forward (job_history_advance): '
'VOLATILE, and it may write that one row.';
