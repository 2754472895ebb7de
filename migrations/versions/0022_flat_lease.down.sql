-- pgstore 0022, downgrade: written by make revision from sql/; 0022_flat_lease.py says what and why.

COMMENT ON FUNCTION job_lease_groups(text[]) IS
'The (queue, priority) pairs that hold pending jobs, of the queues p_queues names '
'(NULL: every queue) that are not paused (queues.paused): one index probe per pair '
'(the default group, queue ''default'' at priority 0, in jobs_pending_by_dispatch_at; '
'the others by a loose scan of jobs_pending_by_queue, from its newest end), never a '
'walk of a backlog, a paused queue''s included. What job_lease_take reads first.';

DROP FUNCTION job_lease_take(text, bigint, bigint, integer, text[], integer[]);

CREATE OR REPLACE FUNCTION job_lease_take(p_holder text, p_now bigint, p_until bigint, p_limit integer, p_queues text[])
 RETURNS SETOF jobs
 LANGUAGE plpgsql
AS $function$
-- Runs as its caller, job_lease or job_lease_many (as the store's owner, on
-- its pinned search_path), after they checked every argument, when some
-- pending job is outside the default group or p_queues names queues.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_queues  text[];
    v_prios   integer[];
    v_default boolean;
    v_window  integer;
    v_left    integer := p_limit;
    v_more    boolean;
    v_rows    jobs[] := ARRAY[]::jobs[];
    v_round   jobs[];
BEGIN
    -- The (queue, priority) groups that hold pending jobs (one index probe each).
    -- Every queue: a statement with no parameter (job_lease_groups is inlined, its
    -- NULL folded), so its plan is made once per session, not at each call (about
    -- 3 ms: seven reads of jobs, each weighing five indexes).
    IF p_queues IS NULL THEN
        SELECT array_agg(g.queue), array_agg(g.priority)
          INTO v_queues, v_prios
          FROM job_lease_groups(NULL) g;
    ELSE
        SELECT array_agg(g.queue), array_agg(g.priority)
          INTO v_queues, v_prios
          FROM job_lease_groups(p_queues) g;
    END IF;
    IF v_queues IS NULL THEN
        RETURN;
    END IF;
    -- Of several, the ones with a job leasable now (a probe of each group's due
    -- head): a group whose jobs are all in the future, or all held, drops out.
    -- One group alone is not probed: the walk below reads its due head anyway.
    IF cardinality(v_queues) > 1 THEN
        SELECT array_agg(g.queue), array_agg(g.priority)
          INTO v_queues, v_prios
          FROM unnest(v_queues, v_prios) AS g(queue, priority)
         WHERE CASE WHEN g.queue = 'default' AND g.priority = 0
                    THEN (SELECT true
                            FROM jobs c
                           WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                             AND c.queue = 'default' AND c.priority = 0
                             AND c.dispatch_at <= p_now
                             AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                           ORDER BY c.dispatch_at, c.run_id
                           LIMIT 1)
                    ELSE (SELECT true
                            FROM jobs c
                           WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                             AND (c.queue <> 'default' OR c.priority <> 0)
                             AND c.queue = g.queue AND c.priority = g.priority
                             AND c.dispatch_at <= p_now
                             AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                           ORDER BY c.dispatch_at, c.run_id
                           LIMIT 1) END;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
    END IF;
    v_default := EXISTS (SELECT FROM unnest(v_queues, v_prios) AS g(queue, priority)
                         WHERE g.queue = 'default' AND g.priority = 0);

    -- Every read of a group below states the predicate of the index that holds
    -- it, so it walks that index and no other (never a paused queue's backlog).
    --
    -- One group with jobs leasable now: its due head in lease order, locked as
    -- it is walked, skipping rows concurrent leasers hold locked; the UPDATE
    -- reaches them through the primary key. Only the branch the CASE takes runs
    -- (InitPlans run when first read). job_fences and store_epoch are read by
    -- this statement (InitPlans, once), never by an earlier one, and a job out
    -- of attempts is failed by this UPDATE instead of leased (it counts against
    -- p_limit and is left out of the answer).
    IF cardinality(v_queues) = 1 THEN
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
             WHERE j.run_id = ANY (CASE WHEN v_default THEN ARRAY(
                       SELECT c.run_id
                         FROM jobs c
                        WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                          AND c.queue = 'default' AND c.priority = 0
                          AND c.dispatch_at <= p_now
                          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                        ORDER BY c.dispatch_at, c.run_id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED)
                   ELSE ARRAY(
                       SELECT c.run_id
                         FROM jobs c
                        WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                          AND (c.queue <> 'default' OR c.priority <> 0)
                          AND c.queue = v_queues[1] AND c.priority = v_prios[1]
                          AND c.dispatch_at <= p_now
                          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                        ORDER BY c.dispatch_at, c.run_id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED) END)
            RETURNING j.*)
        SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
        RETURN;
    END IF;

    -- Several groups with jobs leasable now: the due head of each (tuple ids,
    -- unlocked), then those tuples (one heap page each, no index descent) in
    -- lease order, locked up to v_left: LockRows sits between the sort and the
    -- limit, so it locks in order and no more than it returns, and rechecks
    -- each row it locks in its newest version. The recheck is one opaque
    -- condition (IS TRUE): bare, it would have the planner walk the queues'
    -- whole due backlog in a pending index instead. job_lease's rules for each
    -- job, as above.
    --
    -- Each group's due head is read p_limit + 16 deep, so 16 concurrent leasers
    -- find rows the others have not locked. A round that leases fewer than it
    -- may while some head was cut short reads four times deeper (the rows it
    -- leased are live leases by then, and skipped).
    v_window := p_limit + 16;
    LOOP
        WITH heads AS MATERIALIZED (
            SELECT w.tid, w.priority, w.dispatch_at, w.run_id, w.rn, w.n
              FROM (SELECT x.*, row_number() OVER (ORDER BY x.dispatch_at, x.run_id) AS rn,
                           count(*) OVER () AS n
                      FROM (SELECT c.ctid AS tid, c.priority, c.dispatch_at, c.run_id
                              FROM jobs c
                             WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                               AND c.queue = 'default' AND c.priority = 0
                               AND c.dispatch_at <= p_now
                               AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                             ORDER BY c.dispatch_at, c.run_id
                             LIMIT v_window) x
                     WHERE v_default) w
            UNION ALL
            SELECT w.tid, w.priority, w.dispatch_at, w.run_id, w.rn, w.n
              FROM unnest(v_queues, v_prios) AS g(queue, priority)
             CROSS JOIN LATERAL (
                   SELECT x.*, row_number() OVER (ORDER BY x.dispatch_at, x.run_id) AS rn,
                          count(*) OVER () AS n
                     FROM (SELECT c.ctid AS tid, c.priority, c.dispatch_at, c.run_id
                             FROM jobs c
                            WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                              AND (c.queue <> 'default' OR c.priority <> 0)
                              AND c.queue = g.queue AND c.priority = g.priority
                              AND c.dispatch_at <= p_now
                              AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                            ORDER BY c.dispatch_at, c.run_id
                            LIMIT v_window) x) w
             WHERE g.queue <> 'default' OR g.priority <> 0),
        -- A head cut short (v_window rows read) may hide rows that come before
        -- another group's in lease order: only the rows up to the earliest last
        -- row of a cut head are merged, so a lease never skips an unlocked row
        -- it should have taken first.
        safe AS (
            SELECT h.tid
              FROM heads h
             WHERE NOT EXISTS (
                       SELECT FROM heads l
                        WHERE l.n >= v_window AND l.rn = l.n
                          AND (-l.priority, l.dispatch_at, l.run_id)
                              < (-h.priority, h.dispatch_at, h.run_id))),
        leased AS (
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
                        WHERE c.ctid = ANY (ARRAY(SELECT f.tid FROM safe f))
                          AND (NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                               AND c.dispatch_at <= p_now
                               AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                               AND (c.queue, c.priority) IN (
                                       SELECT * FROM unnest(v_queues, v_prios)))
                              IS TRUE
                        ORDER BY c.priority DESC, c.dispatch_at, c.run_id
                        LIMIT v_left
                          FOR UPDATE SKIP LOCKED))
            RETURNING j AS job)
        SELECT coalesce(array_agg(l.job), ARRAY[]::jobs[]),
               coalesce((SELECT bool_or(h.n >= v_window) FROM heads h), false)
          INTO v_round, v_more
          FROM leased l;

        v_rows := v_rows || v_round;
        v_left := v_left - cardinality(v_round);
        EXIT WHEN v_left <= 0 OR NOT v_more;
        v_window := v_window * 4;
    END LOOP;

    RETURN QUERY
    SELECT r.* FROM unnest(v_rows) r
     WHERE NOT r.failed
     ORDER BY r.priority DESC, r.dispatch_at, r.run_id;
END
$function$;

COMMENT ON FUNCTION job_lease_take(text, bigint, bigint, integer, text[]) IS
'The lease of job_lease and job_lease_many (which check the arguments first) when '
'some pending job is outside the default group (queue ''default'', priority 0) or '
'p_queues names queues: leases to p_holder until p_until up to p_limit due jobs of '
'the queues p_queues names (NULL: every queue), highest priority first, then '
'earliest dispatch_at, then run_id, and returns them in that order; a job out of '
'attempts is failed instead, counted against p_limit and left out. With one (queue, '
'priority) group leasable now, one UPDATE that walks its due head; with several, one '
'UPDATE a round: a second round only when concurrent leasers held every row of a due '
'head it read.';

REVOKE ALL ON FUNCTION job_lease_take(text, bigint, bigint, integer, text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint, p_queues text[] DEFAULT NULL::text[])
 RETURNS SETOF jobs
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now   bigint;
    v_until bigint;
    v_others boolean;
    v_paused boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_queues(p_queues);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The common case, p_queues NULL and every pending job in the default group
    -- (queue 'default', priority 0: an app that uses neither queues nor
    -- priorities; one probe of jobs_pending_by_queue, from its newest end, finds
    -- it empty): the lease of pgstore_0018, over the default group's index. The
    -- scalar subquery is an InitPlan: it runs once, walks the index in lease
    -- order and locks one row, skipping rows that concurrent leasers hold
    -- locked; the UPDATE reaches it through the primary key. job_fences is read
    -- by this statement, with its snapshot (a row visible to it was scheduled
    -- after any purge or remove of its run_id that the mark must cover), and
    -- token_floor() is inlined: store_epoch is read once, by another InitPlan.
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned. Else, or when
    -- p_queues names queues: job_lease_take.
    IF p_queues IS NULL THEN
        SELECT (SELECT true
                  FROM jobs c
                 WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                   AND (c.queue <> 'default' OR c.priority <> 0)
                 ORDER BY c.queue DESC, c.priority
                 LIMIT 1),
               (SELECT s.paused FROM queues s WHERE s.queue = 'default')
          INTO v_others, v_paused;
        IF v_others IS NULL THEN
            IF v_paused THEN
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
            RETURN;
        END IF;
    END IF;

    RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, 1, p_queues);
END
$function$;

CREATE OR REPLACE FUNCTION job_lease_many(p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer, p_queues text[] DEFAULT NULL::text[])
 RETURNS SETOF jobs
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now   bigint;
    v_until bigint;
    v_others boolean;
    v_paused boolean;
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
    -- The common case, p_queues NULL and every pending job in the default group
    -- (queue 'default', priority 0: an app that uses neither queues nor
    -- priorities; one probe of jobs_pending_by_queue, from its newest end, finds
    -- it empty): the lease of pgstore_0018, over the default group's index. The
    -- ARRAY() subquery is an InitPlan: it runs once, walks the index in lease
    -- order and locks up to p_limit rows, skipping rows that concurrent leasers hold
    -- locked; the UPDATE reaches them through the primary key. job_fences is read
    -- by this statement, with its snapshot (a row visible to it was scheduled
    -- after any purge or remove of its run_id that the mark must cover), and
    -- token_floor() is inlined: store_epoch is read once, by another InitPlan.
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned. Else, or when
    -- p_queues names queues: job_lease_take.
    IF p_queues IS NULL THEN
        SELECT (SELECT true
                  FROM jobs c
                 WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                   AND (c.queue <> 'default' OR c.priority <> 0)
                 ORDER BY c.queue DESC, c.priority
                 LIMIT 1),
               (SELECT s.paused FROM queues s WHERE s.queue = 'default')
          INTO v_others, v_paused;
        IF v_others IS NULL THEN
            IF v_paused THEN
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
                 WHERE j.run_id = ANY (ARRAY(
                           SELECT c.run_id
                             FROM jobs c
                            WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                              AND c.queue = 'default' AND c.priority = 0
                              AND c.dispatch_at <= v_now
                              AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                            ORDER BY c.dispatch_at, c.run_id
                            LIMIT p_limit
                              FOR UPDATE SKIP LOCKED))
                RETURNING j.*)
            SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
            RETURN;
        END IF;
    END IF;

    RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, p_limit, p_queues);
END
$function$;

DROP FUNCTION job_lease_due(bigint, text[]);
