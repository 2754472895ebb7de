-- pgstore 0024, downgrade: written by make revision from sql/; 0024_queue_limits.py says what and why.

CREATE OR REPLACE FUNCTION job_renew(p_run_id text, p_holder text, p_now bigint, p_ttl_ms bigint, p_lease_sequence bigint DEFAULT NULL::bigint)
 RETURNS boolean
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_renewed boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_sequence(p_lease_sequence);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    UPDATE jobs
       SET lease_until = v_until
     WHERE run_id = p_run_id
       AND lease_holder = p_holder
       AND lease_until > v_now
       AND (p_lease_sequence IS NULL OR lease_sequence = p_lease_sequence)
    RETURNING true INTO v_renewed;
    RETURN coalesce(v_renewed, false);
END
$function$;

CREATE OR REPLACE FUNCTION job_renew_many(p_run_ids text[], p_holder text, p_now bigint, p_ttl_ms bigint, p_lease_sequences bigint[] DEFAULT NULL::bigint[])
 RETURNS TABLE(run_id text, renewed boolean)
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
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
$function$;

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
    v_queues text[];
    v_prios  integer[];
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
    -- p_queues names queues, job_lease_due finds the groups worth walking (the
    -- default group alone, when no other has a job leasable now: this same
    -- statement), and job_lease_take walks the others.
    IF p_queues IS NULL THEN
        SELECT (SELECT true
                  FROM jobs c
                 WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                   AND (c.queue <> 'default' OR c.priority <> 0)
                 ORDER BY c.queue DESC, c.priority
                 LIMIT 1),
               (SELECT s.paused FROM queues s WHERE s.queue = 'default')
          INTO v_others, v_paused;
    END IF;
    IF p_queues IS NOT NULL OR v_others THEN
        SELECT d.queues, d.priorities INTO v_queues, v_prios FROM job_lease_due(v_now, p_queues) d;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        IF v_queues <> ARRAY['default'] OR v_prios <> ARRAY[0] THEN
            RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, 1,
                                                      v_queues, v_prios);
            RETURN;
        END IF;
    ELSIF v_paused THEN
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
    -- p_queues names queues, job_lease_due finds the groups worth walking (the
    -- default group alone, when no other has a job leasable now: this same
    -- statement), and job_lease_take walks the others.
    IF p_queues IS NULL THEN
        SELECT (SELECT true
                  FROM jobs c
                 WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                   AND (c.queue <> 'default' OR c.priority <> 0)
                 ORDER BY c.queue DESC, c.priority
                 LIMIT 1),
               (SELECT s.paused FROM queues s WHERE s.queue = 'default')
          INTO v_others, v_paused;
    END IF;
    IF p_queues IS NOT NULL OR v_others THEN
        SELECT d.queues, d.priorities INTO v_queues, v_prios FROM job_lease_due(v_now, p_queues) d;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        IF v_queues <> ARRAY['default'] OR v_prios <> ARRAY[0] THEN
            RETURN QUERY SELECT * FROM job_lease_take(p_holder, v_now, v_until, p_limit,
                                                      v_queues, v_prios);
            RETURN;
        END IF;
    ELSIF v_paused THEN
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
END
$function$;

DROP FUNCTION queue_list(bigint);

CREATE OR REPLACE FUNCTION queue_list(p_now bigint DEFAULT NULL::bigint)
 RETURNS TABLE(queue text, depth bigint, due bigint, leased bigint, paused boolean)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
    SELECT coalesce(c.queue, s.queue), coalesce(c.depth, 0), coalesce(c.due, 0),
           coalesce(c.leased, 0), coalesce(s.paused, false)
      FROM counts c
      FULL JOIN queues s ON s.queue = c.queue
     ORDER BY 1;
END
$function$;

COMMENT ON FUNCTION queue_list(bigint) IS
'One row per queue that holds waiting jobs or was ever paused, by name: depth (jobs '
'waiting: not dispatched, cancelled or failed), due (of those, due at p_now, NULL '
'meaning now_ms(), and not held by a live lease: what a lease could take), leased '
'(held by a live lease at p_now) and paused. Reads every waiting job, never the '
'history. 22023: p_now past store_settings.max_clock_skew_ms.';

REVOKE ALL ON FUNCTION queue_list(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION job_lease_take(p_holder text, p_now bigint, p_until bigint, p_limit integer, p_queues text[], p_priorities integer[])
 RETURNS SETOF jobs
 LANGUAGE plpgsql
AS $function$
-- Runs as its caller, job_lease or job_lease_many (as the store's owner, on
-- its pinned search_path), after they checked every argument and found, with
-- job_lease_due, the groups p_queues and p_priorities (in one order) with jobs
-- leasable now: several, or one other than the default group (whose walk is
-- theirs).
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_window  integer;
    v_left    integer := p_limit;
    v_more    boolean;
    v_rows    jobs[] := ARRAY[]::jobs[];
    v_round   jobs[];
    v_default boolean;
BEGIN
    v_default := EXISTS (SELECT FROM unnest(p_queues, p_priorities) AS g(queue, priority)
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
    IF cardinality(p_queues) = 1 AND NOT v_default THEN
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
                          AND (c.queue <> 'default' OR c.priority <> 0)
                          AND c.queue = p_queues[1] AND c.priority = p_priorities[1]
                          AND c.dispatch_at <= p_now
                          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                        ORDER BY c.dispatch_at, c.run_id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
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
              FROM unnest(p_queues, p_priorities) AS g(queue, priority)
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
                                       SELECT * FROM unnest(p_queues, p_priorities)))
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

DROP FUNCTION queue_limits_caps(jsonb, text[]);

DROP FUNCTION queue_limits_keep(text[], text[], bigint[], bigint, bigint);

DROP FUNCTION queue_limits_fill(jsonb, text[], text[], bigint[], bigint, bigint);

DROP FUNCTION queue_limits_reserve(text[], integer[], bigint);

DROP FUNCTION queue_limits_wants(text[], integer[], text[], bigint, integer);

DROP FUNCTION queue_set_rate(text, integer, bigint);

DROP FUNCTION queue_set_concurrency(text, integer);

DROP FUNCTION check_queue_limit(text, integer);

DROP FUNCTION queue_slot_free(text, bigint, bigint, bigint);

DROP FUNCTION queue_limit_max();

-- The limits go with their rows: a queue row kept only for them stays, unpaused.
DROP TABLE queue_slots;

ALTER TABLE queues
    DROP CONSTRAINT queues_check,
    DROP COLUMN concurrency_limit,
    DROP COLUMN rate_limit,
    DROP COLUMN rate_period_ms;

COMMENT ON TABLE queues IS
'The queue controls: one row per queue ever paused (queue_pause writes it, queue_resume '
'clears paused). Written only through those functions; a queue with no row is not paused.';
COMMENT ON COLUMN queues.updated_at IS
'Epoch ms (the database clock) of the last queue_pause or queue_resume that changed the row.';
