-- pgstore: the queue controls (docs/queues.md).
--
-- A queue is any jobs.queue value; it needs no row. Pausing one writes its row in
-- queues (created on first pause), resuming clears the flag. A paused queue's jobs
-- are not leased (job_lease_groups leaves the queue out: its backlog is not read);
-- leases already held run on. Both are one statement, so they hold across hosts:
-- a lease that starts after the pause commits sees it.

CREATE FUNCTION queue_pause(p_queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    -- A name of at most 1024 characters can still exceed the btree's limit on
    -- index entries (incompressible multibyte characters): bad input, not a crash.
    BEGIN
        INSERT INTO queues AS q (queue, paused, updated_at)
        VALUES (p_queue, true, now_ms())
        ON CONFLICT (queue) DO UPDATE
            SET paused = true, updated_at = excluded.updated_at
            WHERE NOT q.paused;
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION queue_pause(text) IS
'Pauses the queue p_queue (any name: it need not hold jobs): job_lease and '
'job_lease_many lease none of its jobs until queue_resume. Leases already held run on '
'(renew, mark and release work as before); scheduling into it works as before. Answers '
'true when it paused the queue, false when it was paused already (nothing changes). '
'22023: p_queue NULL, empty or longer than 1024 characters.';

CREATE FUNCTION queue_resume(p_queue text) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    UPDATE queues q
       SET paused = false, updated_at = now_ms()
     WHERE q.queue = p_queue AND q.paused;
    IF FOUND THEN
        -- Idle dispatchers wake up and lease the queue's due jobs.
        PERFORM pg_notify(job_channel(), now_ms()::text);
        RETURN true;
    END IF;
    RETURN false;
END
$$;

COMMENT ON FUNCTION queue_resume(text) IS
'Resumes the paused queue p_queue: its due jobs are leased again, and at commit '
'job_channel() is notified (with the database clock as the payload) so idle '
'dispatchers wake. Answers true when it resumed the queue, false when it was not '
'paused (nothing changes). 22023: p_queue NULL, empty or longer than 1024 characters.';

CREATE FUNCTION queue_list(p_now bigint DEFAULT NULL)
RETURNS TABLE (
    queue text, depth bigint, due bigint, leased bigint, paused boolean,
    concurrency_limit integer, rate_limit integer, rate_period_ms bigint, rate_used bigint
)
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- Each half's WHERE is one pending index's predicate: one read of the jobs
    -- still waiting, never of the history.
    RETURN QUERY
    WITH counts AS (
        SELECT j.queue,
               count(*) AS depth,
               count(*) FILTER (WHERE j.dispatch_at <= v_now
                                  AND (j.lease_until IS NULL OR j.lease_until <= v_now))
                   AS due,
               count(*) FILTER (WHERE j.lease_until > v_now) AS leased
          FROM (SELECT d.queue, d.dispatch_at, d.lease_until
                  FROM jobs d
                 WHERE NOT d.dispatched AND NOT d.cancelled AND NOT d.failed
                   AND d.queue = 'default' AND d.priority = 0
                UNION ALL
                SELECT q.queue, q.dispatch_at, q.lease_until
                  FROM jobs q
                 WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                   AND (q.queue <> 'default' OR q.priority <> 0)) AS j
         GROUP BY j.queue)
    -- rate_used: the queue's rate places (sql/24_queue_limits.sql) taken in
    -- the last period, what a lease could not take again yet (in numeric: a
    -- window that starts before the smallest bigint is no overflow).
    SELECT coalesce(c.queue, s.queue), coalesce(c.depth, 0), coalesce(c.due, 0),
           coalesce(c.leased, 0), coalesce(s.paused, false),
           s.concurrency_limit, s.rate_limit, s.rate_period_ms,
           CASE WHEN s.rate_limit IS NOT NULL THEN
               (SELECT count(*)
                  FROM queue_slots r
                 CROSS JOIN LATERAL unnest(r.taken_ats) AS t(taken_at)
                 WHERE r.queue = s.queue AND r.slot > 0
                   AND t.taken_at::numeric > v_now::numeric - s.rate_period_ms)
           END
      FROM counts c
      FULL JOIN queues s ON s.queue = c.queue
     ORDER BY 1;
END
$$;

COMMENT ON FUNCTION queue_list(bigint) IS
'One row per queue that holds waiting jobs or was ever paused or limited, by name: '
'depth (jobs waiting: not dispatched, cancelled or failed), due (of those, due at p_now, '
'NULL meaning now_ms(), and not held by a live lease: what a lease could take unless a '
'limit holds it back), leased (held by a live lease at p_now), paused, the limits '
'(queue_set_concurrency, queue_set_rate; NULL: none) and rate_used (leases counted '
'against the rate limit in the period up to p_now; NULL without one). Reads every '
'waiting job, never the history. '
'22023: p_now past store_settings.max_clock_skew_ms.';
