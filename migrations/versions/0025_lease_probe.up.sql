-- pgstore 0025, upgrade: written by make revision from sql/; 0025_lease_probe.py says what and why.

-- The pending jobs outside the default group again, by dispatch_at alone: what
-- the lease's probe reads (one read of the jobs table to build it). The
-- functions below use it. "failed IS NOT TRUE", which the probe says too, keeps
-- the probe from being planned on jobs_pending_by_queue and a sort (sql/20_jobs.sql).
CREATE INDEX jobs_pending_others_by_dispatch_at ON jobs (dispatch_at)
    WHERE NOT dispatched AND NOT cancelled AND failed IS NOT TRUE
      AND (queue <> 'default' OR priority <> 0);

COMMENT ON INDEX jobs_pending_others_by_dispatch_at IS
'The pending jobs of jobs_pending_by_queue (outside the default group) by dispatch_at: '
'job_lease and job_lease_many read its last entry up to now to tell whether any of them '
'is due; when none is, the lease walks the default group alone.';

CREATE OR REPLACE FUNCTION job_lease_due(
    p_now bigint, p_queues text[], OUT queues text[], OUT priorities integer[]
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
AS $$
-- Runs as its caller, job_lease or job_lease_many (as the store's owner, on
-- its pinned search_path), after they checked every argument, when some
-- pending job outside the default group is due (or the default queue, named,
-- is limited).
--
-- Each statement is planned once per session (a generic plan): a custom plan,
-- made at every call as p_now and p_queues change, cost more than all the
-- probes it runs (0.3 to 1.5 ms a call). A generic plan must never scan the
-- table: every read of jobs below is a scalar LIMIT 1 subquery (never an
-- EXISTS, which the planner may turn into a hash join over a whole group) that
-- equates one group's queue and priority (the outer row's, or the default
-- group's constants), states the predicate of the index that holds the group
-- and orders by that index's next columns, so a descent of that index serves
-- it and the first entry it finds ends it.
--
-- The groups worth walking: those other than the default group (queue
-- 'default', priority 0) whose due head holds a job leasable now, and the
-- default group when it may be leased (named, not paused) and either no other
-- group is (its walk, the caller's, then probes it itself) or its due head
-- holds one. Paused queues are left out, their backlog unread.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    IF p_queues IS NULL THEN
        -- Every queue: the groups of jobs_pending_by_queue by the loose index
        -- scan of job_lease_groups, backwards; no parameter but p_now.
        WITH RECURSIVE pairs AS (
            (SELECT c.queue, c.priority
               FROM jobs c
              WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                AND (c.queue <> 'default' OR c.priority <> 0)
              ORDER BY c.queue DESC, c.priority
              LIMIT 1)
            UNION ALL
            SELECT n.queue, n.priority
              FROM pairs p
             CROSS JOIN LATERAL (
                   (SELECT c.queue, c.priority
                      FROM jobs c
                     WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                       AND (c.queue <> 'default' OR c.priority <> 0)
                       AND c.queue = p.queue AND c.priority > p.priority
                     ORDER BY c.priority
                     LIMIT 1)
                   UNION ALL
                   (SELECT c.queue, c.priority
                      FROM jobs c
                     WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                       AND (c.queue <> 'default' OR c.priority <> 0)
                       AND c.queue < p.queue
                     ORDER BY c.queue DESC, c.priority
                     LIMIT 1)
                   LIMIT 1) n
        ),
        others AS MATERIALIZED (
            SELECT p.queue, p.priority
              FROM pairs p
             WHERE (SELECT true
                       FROM jobs c
                      WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                        AND (c.queue <> 'default' OR c.priority <> 0)
                        AND c.queue = p.queue AND c.priority = p.priority
                        AND c.dispatch_at <= p_now
                        AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                      ORDER BY c.dispatch_at, c.run_id
                      LIMIT 1)
               AND NOT EXISTS (SELECT FROM queues s WHERE s.queue = p.queue AND s.paused)
        )
        SELECT array_agg(d.queue), array_agg(d.priority)
          INTO queues, priorities
          FROM (SELECT o.queue, o.priority FROM others o
                UNION ALL
                SELECT 'default'::text COLLATE "C", 0
                 WHERE NOT EXISTS (SELECT FROM queues s
                                    WHERE s.queue = 'default' AND s.paused)
                   AND (NOT EXISTS (SELECT FROM others)
                        OR (SELECT true
                               FROM jobs c
                              WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                                AND c.queue = 'default' AND c.priority = 0
                                AND c.dispatch_at <= p_now
                                AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                              ORDER BY c.dispatch_at, c.run_id
                              LIMIT 1))) d;
    ELSE
        -- Given queues: job_lease_groups (the default group's among them when
        -- named and holding a pending job; paused queues left out).
        WITH groups AS MATERIALIZED (
            SELECT g.queue, g.priority FROM job_lease_groups(p_queues) g
        ),
        others AS MATERIALIZED (
            SELECT g.queue, g.priority
              FROM groups g
             WHERE (g.queue <> 'default' OR g.priority <> 0)
               AND (SELECT true
                       FROM jobs c
                      WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                        AND (c.queue <> 'default' OR c.priority <> 0)
                        AND c.queue = g.queue AND c.priority = g.priority
                        AND c.dispatch_at <= p_now
                        AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                      ORDER BY c.dispatch_at, c.run_id
                      LIMIT 1)
        )
        SELECT array_agg(d.queue), array_agg(d.priority)
          INTO queues, priorities
          FROM (SELECT o.queue, o.priority FROM others o
                UNION ALL
                SELECT g.queue, g.priority
                  FROM groups g
                 WHERE g.queue = 'default' AND g.priority = 0
                   AND (NOT EXISTS (SELECT FROM others)
                        OR (SELECT true
                               FROM jobs c
                              WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                                AND c.queue = 'default' AND c.priority = 0
                                AND c.dispatch_at <= p_now
                                AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                              ORDER BY c.dispatch_at, c.run_id
                              LIMIT 1))) d;
    END IF;
END
$$;

COMMENT ON FUNCTION job_lease_due(bigint, text[]) IS
'The (queue, priority) groups a lease at p_now walks, of the queues p_queues names '
'(NULL: every queue), none paused, as two arrays in one order (both NULL: none): each '
'group other than the default one (queue ''default'', priority 0) whose due head holds '
'a job leasable at p_now (due, not under a live lease), and the default group when it '
'may be leased and either no other group is listed or its due head holds one. Index '
'probes only (job_lease_groups, then one probe of each group''s due head), each '
'statement planned once per session. What job_lease and job_lease_many read when some '
'pending job outside the default group is due, or the default queue (named) is limited.';

CREATE OR REPLACE FUNCTION job_lease(
    p_holder text, p_now bigint, p_ttl_ms bigint, p_queues text[] DEFAULT NULL
) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
    v_others boolean;
    v_paused boolean;
    v_limited boolean;
    v_default boolean;
    v_queues text[];
    v_prios  integer[];
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_queues(p_queues);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The common case, no pending job outside the default group (queue
    -- 'default', priority 0) due now (an app that uses neither queues nor
    -- priorities, or whose other jobs wait for a later time) and the default
    -- queue named, not paused nor limited: the lease of pgstore_0018, over the
    -- default group's index. The scalar subquery is an InitPlan: it runs once,
    -- walks the index in lease order and locks one row, skipping rows that
    -- concurrent leasers hold locked; the UPDATE reaches it through the primary
    -- key. job_fences is read
    -- by this statement, with its snapshot (a row visible to it was scheduled
    -- after any purge or remove of its run_id that the mark must cover), and
    -- token_floor() is inlined: store_epoch is read once, by another InitPlan.
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned. Else job_lease_due
    -- finds the groups worth walking (the default group alone, when no other has
    -- a job leasable now: this same statement), and job_lease_take walks the
    -- others.
    --
    -- One statement tells which: whether a pending job outside the default
    -- group is due (one probe of jobs_pending_others_by_dispatch_at, from now
    -- backwards: the entries of jobs dispatched since the last vacuum sit at
    -- its oldest end, where the leases take them), and the default queue's
    -- controls (one probe of queues). While none of those jobs is due (none at
    -- all, or future ones only, whatever their priority), none is leasable, so
    -- the lease is the default group's walk alone (or nothing, when the
    -- default queue is paused or p_queues does not name it). A due one
    -- (leasable or not: a live lease's job keeps its entry) sends the lease to
    -- job_lease_due.
    SELECT coalesce((SELECT true
                       FROM jobs c
                      WHERE NOT c.dispatched AND NOT c.cancelled AND c.failed IS NOT TRUE
                        AND (c.queue <> 'default' OR c.priority <> 0)
                        AND c.dispatch_at <= v_now
                      ORDER BY c.dispatch_at DESC
                      LIMIT 1), false),
           s.paused, s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL
      INTO v_others, v_paused, v_limited
      FROM (SELECT) AS one
      LEFT JOIN queues s ON s.queue = 'default';
    v_default := p_queues IS NULL OR 'default' = ANY (p_queues);
    -- A limited 'default' (sql/24_queue_limits.sql) is walked by job_lease_take,
    -- which keeps its limits; the same probe of queues tells.
    IF v_others OR (v_limited AND v_default) THEN
        SELECT d.queues, d.priorities INTO v_queues, v_prios FROM job_lease_due(v_now, p_queues) d;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        IF v_queues <> ARRAY['default'] OR v_prios <> ARRAY[0] OR v_limited THEN
            RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, 1,
                                                      v_queues, v_prios);
            RETURN;
        END IF;
    ELSIF v_paused OR NOT v_default THEN
        RETURN;
    END IF;
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1,
                                                   (SELECT token_floor_at(
                                                               (SELECT e.epoch
                                                                  FROM store_epoch e))),
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times '
                                             '(max_attempts %s), the last lease '
                                             'expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = (
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                      AND c.queue = 'default' AND c.priority = 0
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed;
END
$$;

CREATE FUNCTION job_lease_default(
    p_holder text, p_now bigint, p_until bigint, p_limit integer
) RETURNS SETOF jobs
LANGUAGE plpgsql
SET plan_cache_mode = force_generic_plan
AS $$
-- Runs as its caller, job_lease_many (as the store's owner, on its pinned
-- search_path), after it checked every argument and found that only the
-- default group (queue 'default', priority 0) may have jobs leasable now.
--
-- Planned once per session (a generic plan). Under the default plan cache
-- mode the statement was planned again at every call once the table held
-- more pending jobs than a few p_limit: the generic plan's cost assumes its
-- LIMIT p_limit keeps a tenth of the rows the walk may read, so it never
-- looked cheaper than a custom one (a few hundred us of planning a call). The
-- walk's plan does not depend on the values: the index of the default group,
-- in lease order, the first p_limit rows it can lock.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN p_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1,
                                                   (SELECT token_floor_at(
                                                               (SELECT e.epoch
                                                                  FROM store_epoch e))),
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times '
                                             '(max_attempts %s), the last lease '
                                             'expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = ANY (ARRAY(
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                      AND c.queue = 'default' AND c.priority = 0
                      AND c.dispatch_at <= p_now
                      AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
END
$$;

COMMENT ON FUNCTION job_lease_default(text, bigint, bigint, integer) IS
'The lease of job_lease_many (which checks the arguments first) when only the default '
'group (queue ''default'', priority 0) may have jobs leasable at p_now: leases to '
'p_holder until p_until up to p_limit due jobs of that group, earliest dispatch_at '
'first, then run_id, and returns them in that order, as job_lease_many does; a job out '
'of attempts is failed instead, counted against p_limit and left out. One UPDATE, '
'planned once per session.';

CREATE OR REPLACE FUNCTION job_lease_many(
    p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer,
    p_queues text[] DEFAULT NULL
) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
    v_others boolean;
    v_paused boolean;
    v_limited boolean;
    v_default boolean;
    v_queues text[];
    v_prios  integer[];
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_positive('limit', p_limit);
    IF p_limit > batch_max() THEN
        PERFORM raise_invalid(format('limit must be at most %s', batch_max()));
    END IF;
    PERFORM check_queues(p_queues);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- token_floor() once per call, not once per row: inlined in a scalar
    -- subquery, an InitPlan (bare in the SET list it read the WAL position for
    -- every job). One value is right for the whole batch: a primary writes on
    -- one timeline for as long as it runs, check_primary() above has refused
    -- a standby, and store_epoch is read in the statement's snapshot.
    --
    -- The common case, no pending job outside the default group (queue
    -- 'default', priority 0) due now (an app that uses neither queues nor
    -- priorities, or whose other jobs wait for a later time) and the default
    -- queue named, not paused nor limited: the lease of pgstore_0018, over the
    -- default group's index, in job_lease_default (planned once per session).
    -- Its ARRAY() subquery is an InitPlan: it runs once, walks the index in lease
    -- order and locks up to p_limit rows, skipping rows that concurrent leasers hold
    -- locked; the UPDATE reaches them through the primary key. job_fences is read
    -- by this statement, with its snapshot (a row visible to it was scheduled
    -- after any purge or remove of its run_id that the mark must cover), and
    -- token_floor() is inlined: store_epoch is read once, by another InitPlan.
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned. Else job_lease_due
    -- finds the groups worth walking (the default group alone, when no other has
    -- a job leasable now: this same statement), and job_lease_take walks the
    -- others.
    --
    -- One statement tells which: whether a pending job outside the default
    -- group is due (one probe of jobs_pending_others_by_dispatch_at, from now
    -- backwards: the entries of jobs dispatched since the last vacuum sit at
    -- its oldest end, where the leases take them), and the default queue's
    -- controls (one probe of queues). While none of those jobs is due (none at
    -- all, or future ones only, whatever their priority), none is leasable, so
    -- the lease is the default group's walk alone (or nothing, when the
    -- default queue is paused or p_queues does not name it). A due one
    -- (leasable or not: a live lease's job keeps its entry) sends the lease to
    -- job_lease_due.
    SELECT coalesce((SELECT true
                       FROM jobs c
                      WHERE NOT c.dispatched AND NOT c.cancelled AND c.failed IS NOT TRUE
                        AND (c.queue <> 'default' OR c.priority <> 0)
                        AND c.dispatch_at <= v_now
                      ORDER BY c.dispatch_at DESC
                      LIMIT 1), false),
           s.paused, s.concurrency_limit IS NOT NULL OR s.rate_limit IS NOT NULL
      INTO v_others, v_paused, v_limited
      FROM (SELECT) AS one
      LEFT JOIN queues s ON s.queue = 'default';
    v_default := p_queues IS NULL OR 'default' = ANY (p_queues);
    -- A limited 'default' (sql/24_queue_limits.sql) is walked by job_lease_take,
    -- which keeps its limits; the same probe of queues tells.
    IF v_others OR (v_limited AND v_default) THEN
        SELECT d.queues, d.priorities INTO v_queues, v_prios FROM job_lease_due(v_now, p_queues) d;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        IF v_queues <> ARRAY['default'] OR v_prios <> ARRAY[0] OR v_limited THEN
            RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, p_limit,
                                                      v_queues, v_prios);
            RETURN;
        END IF;
    ELSIF v_paused OR NOT v_default THEN
        RETURN;
    END IF;
    RETURN QUERY SELECT * FROM job_lease_default(p_holder, v_now, v_until, p_limit);
END
$$;

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
