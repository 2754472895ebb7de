-- pgstore: the job store's API.
--
-- Every function validates all of its arguments before touching a row, so a
-- bad argument raises 22023 (naming the parameter) and changes nothing,
-- whatever the state of the row. Times are epoch ms; a NULL p_now means
-- now_ms(), the database clock. Every function that writes starts with
-- check_primary(): on a standby it fails at once, naming the server as one.
-- job_renew, job_mark_dispatched and job_release take the lease_sequence that
-- job_lease returned as an optional fence (NULL: any lease of the holder).
-- A p_now that is not NULL must lie within
-- store_settings.max_clock_skew_ms of that clock when the owner sets a bound,
-- and a ttl_ms at most store_settings.max_lease_ms (off by default: see
-- 01_settings.sql).
--
-- A job is leased at most max_attempts times. Once attempts >= max_attempts
-- (its last lease was taken), the job fails instead of being leased again:
-- at the job_release of that lease, or, when that lease expired without a
-- release (a dispatcher that crashes on the job: a poison job), at the
-- job_lease that finds it due again.

CREATE FUNCTION job_channel() RETURNS text
LANGUAGE sql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT CASE WHEN octet_length(current_schema()) <= 58
                THEN current_schema() || '.jobs'
                ELSE md5(current_schema()) || '.jobs' END
$$;

COMMENT ON FUNCTION job_channel() IS
'The NOTIFY channel job_schedule notifies: "<schema>.jobs" (an md5 of the schema '
'name when it is too long for a channel). Idle dispatchers LISTEN on it (quoted: '
'LISTEN "pgstore.jobs") to lease a job scheduled due-now without polling faster.';

CREATE FUNCTION check_payload(p_param text, p_value jsonb) RETURNS void
LANGUAGE plpgsql
AS $$
-- Runs as its caller, an API function: as the store's owner, on that
-- function's pinned search_path. Reads store_settings only for a payload.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_max integer;
BEGIN
    IF p_value IS NOT NULL THEN
        SELECT s.max_payload_bytes INTO v_max FROM store_settings s;
        IF octet_length(p_value::text) > v_max THEN
            PERFORM raise_invalid(format(
                '%s must be at most %s bytes as JSON text (store_settings.max_payload_bytes)',
                p_param, v_max));
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION check_payload(text, jsonb) IS
'Raises 22023 naming p_param when p_value (NULL passes) is longer, as JSON text in '
'UTF-8, than store_settings.max_payload_bytes.';

CREATE FUNCTION check_queues(p_queues text[]) RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    IF p_queues IS NOT NULL AND (
           array_ndims(p_queues) IS DISTINCT FROM 1 OR cardinality(p_queues) > 1024
           OR EXISTS (SELECT FROM unnest(p_queues) AS u(q)
                       WHERE q IS NULL OR q = '' OR length(q) > 1024)) THEN
        PERFORM raise_invalid(
            'queues must be NULL (every queue) or a one-dimensional, non-empty array of at '
            'most 1024 non-empty strings of at most 1024 characters');
    END IF;
END
$$;

COMMENT ON FUNCTION check_queues(text[]) IS
'Raises 22023 naming queues unless p_queues is NULL (every queue) or a non-empty, '
'one-dimensional array of at most 1024 queue names (non-empty, at most 1024 '
'characters; repeats allowed).';

CREATE FUNCTION job_schedule(
    p_run_id text, p_dispatch_at bigint, p_max_attempts integer DEFAULT NULL,
    p_queue text DEFAULT NULL, p_priority integer DEFAULT NULL, p_payload jsonb DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_present('dispatch_at', p_dispatch_at);
    IF p_max_attempts IS NOT NULL THEN
        PERFORM check_positive('max_attempts', p_max_attempts);
    END IF;
    IF p_queue IS NOT NULL THEN
        PERFORM check_name('queue', p_queue);
    END IF;
    PERFORM check_payload('payload', p_payload);

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    --
    -- queue, priority and payload: NULL means the default for a new job and
    -- "keep" for an existing one, so a call that only moves a job (as every
    -- call did before pgstore_0019) never moves it to another queue.
    BEGIN
        INSERT INTO jobs AS j (run_id, dispatch_at, max_attempts, queue, priority, payload)
        VALUES (p_run_id, p_dispatch_at,
                coalesce(p_max_attempts,
                         (SELECT s.default_max_attempts FROM store_settings s)),
                coalesce(p_queue, 'default'), coalesce(p_priority, 0), p_payload)
        ON CONFLICT (run_id) DO UPDATE
            SET dispatch_at = excluded.dispatch_at,
                max_attempts = coalesce(p_max_attempts, j.max_attempts),
                queue = coalesce(p_queue, j.queue),
                priority = coalesce(p_priority, j.priority),
                payload = coalesce(p_payload, j.payload);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'run_id is too long to index: at most about 2700 bytes of UTF-8';
    END;

    -- Delivered at commit. Only scheduling notifies: a NOTIFY on the lease,
    -- renew or dispatch path would serialise every commit in the database.
    PERFORM pg_notify(job_channel(), p_dispatch_at::text);
END
$$;

COMMENT ON FUNCTION job_schedule(text, bigint, integer, text, integer, jsonb) IS
'Adds the job p_run_id, due at p_dispatch_at, with at most p_max_attempts leases '
'(NULL: store_settings.default_max_attempts, 25 unless the owner changed it), in queue '
'p_queue (NULL: ''default''), at priority p_priority (higher is leased first; NULL: 0), '
'carrying p_payload (any JSON; NULL: none). For an existing job moves dispatch_at, and '
'replaces max_attempts, queue, priority and payload each only when given (not NULL): '
'a NULL keeps the job''s own, so a call that only moves a job keeps its queue, '
'priority and payload; lease, attempts, worker_id, dispatched, cancelled and failed '
'are preserved. At commit, notifies job_channel() with dispatch_at as the payload. '
'22023 and nothing changes: p_max_attempts not positive, p_queue empty or longer than '
'1024 characters, p_payload longer than store_settings.max_payload_bytes as JSON text.';

CREATE FUNCTION job_lease_groups(p_queues text[]) RETURNS TABLE (queue text, priority integer)
LANGUAGE sql STABLE
AS $$
    -- The default group (queue 'default', priority 0) when it holds a pending
    -- job (one probe of jobs_pending_by_dispatch_at), and the groups of
    -- jobs_pending_by_queue by a loose index scan, backwards: one probe per
    -- (queue, priority) group, whatever the group holds. Every queue (p_queues
    -- NULL): the last pair, then from each pair the next higher priority of its
    -- queue or else the last pair of the queue before. Given queues: each one's
    -- priorities, from its lowest up (an ordered walk of "queue = ANY" would
    -- read every entry). Backwards, because each probe then lands on a group's
    -- newest entries: the entries of jobs dispatched since the last vacuum sit
    -- at the oldest end of each group, where the lease walks. Each read states
    -- its index's predicate, so that it can use that index and no other.
    WITH RECURSIVE pairs AS (
        (SELECT c.queue, c.priority
           FROM jobs c
          WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
            AND (c.queue <> 'default' OR c.priority <> 0)
            AND p_queues IS NULL
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
    named AS (
        SELECT DISTINCT u.queue FROM unnest(p_queues) AS u(queue)
    ),
    given AS (
        SELECT g.queue, g.priority
          FROM named q
         CROSS JOIN LATERAL (
               WITH RECURSIVE levels AS (
                   (SELECT c.queue, c.priority
                      FROM jobs c
                     WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                       AND (c.queue <> 'default' OR c.priority <> 0)
                       AND c.queue = q.queue
                     ORDER BY c.priority
                     LIMIT 1)
                   UNION ALL
                   SELECT n.queue, n.priority
                     FROM levels l
                    CROSS JOIN LATERAL (
                          SELECT c.queue, c.priority
                            FROM jobs c
                           WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                             AND (c.queue <> 'default' OR c.priority <> 0)
                             AND c.queue = l.queue AND c.priority > l.priority
                           ORDER BY c.priority
                           LIMIT 1) n
               )
               SELECT v.queue, v.priority FROM levels v) g
    ),
    dflt AS (
        SELECT 'default'::text COLLATE "C" AS queue, 0 AS priority
         WHERE (p_queues IS NULL OR 'default' = ANY (p_queues))
           AND (SELECT true
                  FROM jobs c
                 WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                   AND c.queue = 'default' AND c.priority = 0
                 ORDER BY c.dispatch_at DESC, c.run_id DESC
                 LIMIT 1)
    ),
    every AS (
        SELECT d.queue, d.priority FROM dflt d
        UNION ALL
        SELECT p.queue, p.priority FROM pairs p
        UNION ALL
        SELECT g.queue, g.priority FROM given g
    )
    SELECT e.queue, e.priority FROM every e
     WHERE NOT EXISTS (SELECT FROM queues s WHERE s.queue = e.queue AND s.paused)
$$;

COMMENT ON FUNCTION job_lease_groups(text[]) IS
'The (queue, priority) pairs that hold pending jobs, of the queues p_queues names '
'(NULL: every queue) that are not paused (queues.paused): one index probe per pair (the '
'default group, queue ''default'' at priority 0, in jobs_pending_by_dispatch_at; the '
'others by a loose scan of jobs_pending_by_queue, from its newest end), never a walk of '
'a backlog, a paused queue''s included. What job_lease_due reads first.';

CREATE FUNCTION job_lease_due(
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

CREATE FUNCTION job_lease_take(
    p_holder text, p_now bigint, p_until bigint, p_limit integer,
    p_queues text[], p_priorities integer[]
) RETURNS SETOF jobs
LANGUAGE plpgsql
AS $$
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
    v_queues  text[] := p_queues;
    v_prios   integer[] := p_priorities;
    v_limited text[];  -- the limited queues among the groups
    v_limits  jsonb;   -- NULL: none
    v_caps    jsonb;
    v_one     boolean := false;
BEGIN
    -- Queue limits (sql/24_queue_limits.sql): the limited queues among the
    -- groups (one probe of queues a queue); lock their lanes first, one row a
    -- job, as many as each has jobs leasable now (up to p_limit), and lease at
    -- most as many of each one's jobs (its cap); a queue with none free drops
    -- out, like a paused one. Its leases take the rounds below, which write
    -- them into the lanes at the end.
    SELECT array_agg(q.queue) INTO v_limited
      FROM queues q
     WHERE q.queue = ANY (v_queues)
       AND (q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL);
    IF v_limited IS NOT NULL THEN
        SELECT queue_limits_reserve(array_agg(w.queue), array_agg(w.want), p_now)
          INTO v_limits
          FROM queue_limits_wants(v_queues, v_prios, v_limited, p_now, p_limit) w;
        v_caps := queue_limits_caps(v_limits, '{}');
        SELECT array_agg(g.queue), array_agg(g.priority)
          INTO v_queues, v_prios
          FROM unnest(v_queues, v_prios) AS g(queue, priority)
         WHERE coalesce((v_caps ->> g.queue)::integer, 1) > 0;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        -- One queue only (one group, or the priorities of one): its cap is the
        -- limit of the lease; else each limited queue's first cap rows are its
        -- candidates.
        v_one := (SELECT count(DISTINCT g.queue) = 1 FROM unnest(v_queues) AS g(queue));
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
    -- (Without limits v_queues and v_prios are p_queues and p_priorities.)
    IF cardinality(v_queues) = 1 AND NOT v_default AND v_limits IS NULL THEN
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
            SELECT w.tid, 'default'::text AS queue, w.priority, w.dispatch_at, w.run_id,
                   w.rn, w.n
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
            SELECT w.tid, g.queue, w.priority, w.dispatch_at, w.run_id, w.rn, w.n
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
        -- A limited queue's first cap rows in lease order, over its groups (one
        -- queue only: all of them, and its cap limits the lease below). Without
        -- limits the heads as they are: the other branch reads no row.
        capped AS (
            SELECT h.tid, h.priority, h.dispatch_at, h.run_id
              FROM heads h
             WHERE v_limits IS NULL
            UNION ALL
            SELECT c.tid, c.priority, c.dispatch_at, c.run_id
              FROM (SELECT h.*,
                           row_number() OVER (PARTITION BY h.queue
                                              ORDER BY h.priority DESC, h.dispatch_at,
                                                       h.run_id) AS qn
                      FROM heads h
                     WHERE v_limits IS NOT NULL) c
             WHERE v_one OR c.qn <= coalesce((v_caps ->> c.queue)::integer, c.qn)),
        safe AS (
            SELECT h.tid
              FROM capped h
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
                        LIMIT CASE WHEN v_one
                                   THEN least(v_left, (v_caps ->> v_queues[1])::integer)
                                   ELSE v_left END
                          FOR UPDATE SKIP LOCKED))
            RETURNING j AS job)
        SELECT coalesce(array_agg(l.job), ARRAY[]::jobs[]),
               coalesce((SELECT bool_or(h.n >= v_window) FROM heads h), false)
          INTO v_round, v_more
          FROM leased l;

        v_rows := v_rows || v_round;
        v_left := v_left - cardinality(v_round);
        IF v_limits IS NOT NULL THEN
            v_caps := queue_limits_caps(
                v_limits, ARRAY(SELECT r.queue FROM unnest(v_rows) r WHERE NOT r.failed));
            -- A job of a limited queue failed instead of leased was one of the
            -- queue's capped candidates and took none of its lanes: another
            -- round, for the queue's next jobs, as the next single lease would
            -- take them.
            v_more := v_more OR EXISTS (
                          SELECT FROM unnest(v_round) r
                           WHERE r.failed AND (v_caps ->> r.queue)::integer > 0);
        END IF;
        EXIT WHEN v_left <= 0 OR NOT v_more;
        v_window := v_window * 4;
    END LOOP;
    IF v_limits IS NOT NULL THEN
        -- A job failed instead of leased took no row.
        PERFORM queue_limits_fill(v_limits, array_agg(r.queue), array_agg(r.run_id),
                                  array_agg(r.lease_sequence), p_now, p_until)
           FROM unnest(v_rows) r
          WHERE NOT r.failed;
    END IF;

    RETURN QUERY
    SELECT r.* FROM unnest(v_rows) r
     WHERE NOT r.failed
     ORDER BY r.priority DESC, r.dispatch_at, r.run_id;
END
$$;

COMMENT ON FUNCTION job_lease_take(text, bigint, bigint, integer, text[], integer[]) IS
'The lease of job_lease and job_lease_many (which check the arguments first) when some '
'pending job is outside the default group (queue ''default'', priority 0) or p_queues '
'names queues: leases to p_holder until p_until up to p_limit due jobs of the queues '
'p_queues names (NULL: every queue), highest priority first, then earliest dispatch_at, '
'then run_id, and returns them in that order; a job out of attempts is failed instead, '
'counted against p_limit and left out. With one (queue, priority) group leasable now, '
'one UPDATE that walks its due head; with several, one UPDATE a round: a second round '
'only when concurrent leasers held every row of a due head it read.';

CREATE FUNCTION job_lease(
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

COMMENT ON FUNCTION job_lease(text, bigint, bigint, text[]) IS
'Leases to p_holder, until now + p_ttl_ms, the next due (dispatch_at <= now), '
'uncancelled, undispatched, unfailed job whose lease is absent or expired, of the '
'queues p_queues names (NULL, the default: every queue): highest priority first, then '
'earliest dispatch_at, then run_id; bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline, and above '
'job_fences.lease_sequence: above every lease of a deleted job) and adds one to its '
'attempts. Returns it (with its queue, priority and payload), with the new '
'lease_sequence and attempts, or no row. A job is '
'leased at most max_attempts times: when that next job has attempts >= max_attempts '
'(its last lease expired without a release) it is failed instead (failed, '
'finished_at = now_ms(), lease cleared, last_error says why) and no row is returned. '
'Rows locked by concurrent leasers are skipped, so an empty answer means '
'nothing leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives. 22023: p_ttl_ms above store_settings.max_lease_ms; p_queues '
'empty, holding a NULL or empty name, or longer than 1024.';

CREATE FUNCTION job_renew(
    p_run_id text, p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequence bigint DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_renewed  boolean;
    v_queue    text;
    v_sequence bigint;
    v_limited  boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_sequence(p_lease_sequence);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The same probe of queues tells whether the job's queue has a concurrency
    -- limit: then the lease's place in queue_slots is extended too, or the lease
    -- ends (sql/24_queue_limits.sql).
    UPDATE jobs j
       SET lease_until = v_until
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND j.lease_until > v_now
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
    RETURNING true, j.queue, j.lease_sequence,
              (SELECT q.concurrency_limit IS NOT NULL FROM queues q WHERE q.queue = j.queue)
         INTO v_renewed, v_queue, v_sequence, v_limited;
    IF v_limited
       AND cardinality(queue_limits_keep(ARRAY[v_queue], ARRAY[p_run_id], ARRAY[v_sequence],
                                         v_now, v_until)) > 0 THEN
        -- The queue is full and this lease holds none of its rows: it ends now.
        UPDATE jobs j SET lease_until = v_now WHERE j.run_id = p_run_id;
        RETURN false;
    END IF;
    RETURN coalesce(v_renewed, false);
END
$$;

COMMENT ON FUNCTION job_renew(text, text, bigint, bigint, bigint) IS
'Extends p_holder''s lease on p_run_id to now + p_ttl_ms, only if p_holder holds '
'an unexpired lease (lease_until > now) and, when p_lease_sequence is given, it is '
'that lease (lease_sequence = p_lease_sequence); true even when the job is cancelled or '
'dispatched. False: the lease expired or another holder took it, and the holder '
'must stop. 22023: p_ttl_ms above store_settings.max_lease_ms.';

CREATE FUNCTION job_mark_dispatched(
    p_run_id text, p_holder text, p_worker_id text, p_lease_sequence bigint DEFAULT NULL
) RETURNS TABLE (cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_cancelled boolean;
    v_finished  bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    IF length(p_worker_id) > 1024 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'worker_id must be a string of at most 1024 characters';
    END IF;
    PERFORM check_sequence(p_lease_sequence);

    -- Under READ COMMITTED a concurrent job_cancel either committed before
    -- this UPDATE took the row lock (the re-checked row then says cancelled)
    -- or waits for it and then sees the job dispatched. A job already
    -- recalled (dispatched and cancelled) is left to the UPDATE below, so a
    -- cancelled job answered here was recalled by this very call, and only
    -- then is store_stats' history told (job_history_move), once.
    UPDATE jobs j
       SET dispatched = true,
           worker_id = p_worker_id,
           finished_at = coalesce(j.finished_at, now_ms())
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
       AND NOT (j.dispatched AND j.cancelled)
    RETURNING j.cancelled, j.finished_at INTO v_cancelled, v_finished;
    IF FOUND THEN
        IF v_cancelled THEN  -- a recall: the cancel's finished_at is kept
            PERFORM job_history_move(ARRAY[v_finished], ARRAY['cancelled'], ARRAY['recalled']);
        END IF;
        RETURN QUERY SELECT v_cancelled, true;
        RETURN;
    END IF;

    -- The mark repeated by the holder of a recalled job: the worker recorded
    -- again, as for any job; the recall was counted by the first mark.
    UPDATE jobs j
       SET worker_id = p_worker_id
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
       AND j.dispatched AND j.cancelled;
    IF FOUND THEN
        RETURN QUERY SELECT true, true;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT coalesce((SELECT j.cancelled FROM jobs j WHERE j.run_id = p_run_id), false), false;
END
$$;

COMMENT ON FUNCTION job_mark_dispatched(text, text, text, bigint) IS
'Records the dispatch of p_run_id by p_holder (its lease may have expired: a '
'dispatch can outlive its lease) with p_worker_id (NULL allowed): one row '
'(cancelled, recorded). recorded = true when lease_holder = p_holder (and, when '
'p_lease_sequence is given, lease_sequence = p_lease_sequence), and then '
'cancelled says whether a cancel arrived (tell the bot to leave at once); '
'finished_at is set to now unless a cancel set it already. '
'Another holder (or lease) took the job, or it is gone: nothing changes, recorded = false, '
'cancelled = the stored flag (false for a missing job). The lease is left as it is.';

CREATE FUNCTION job_release(
    p_run_id text, p_holder text, p_retry_at bigint, p_lease_sequence bigint DEFAULT NULL,
    p_error text DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_released boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_present('retry_at', p_retry_at);
    PERFORM check_sequence(p_lease_sequence);
    IF length(p_error) > 4096 THEN
        PERFORM raise_invalid('error must be a string of at most 4096 characters');
    END IF;

    -- attempts >= max_attempts: the lease just given back was the job's last, so
    -- the job fails (terminal) instead of waiting for p_retry_at.
    UPDATE jobs j
       SET lease_holder = NULL,
           lease_until = NULL,
           dispatch_at = CASE WHEN j.attempts >= j.max_attempts
                              THEN j.dispatch_at ELSE p_retry_at END,
           failed = j.attempts >= j.max_attempts,
           finished_at = CASE WHEN j.attempts >= j.max_attempts
                              THEN coalesce(j.finished_at, now_ms()) ELSE j.finished_at END,
           last_error = coalesce(p_error, j.last_error)
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND NOT j.dispatched
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
    RETURNING true INTO v_released;
    RETURN coalesce(v_released, false);
END
$$;

COMMENT ON FUNCTION job_release(text, text, bigint, bigint, text) IS
'Gives up p_holder''s lease on p_run_id without dispatching (the dispatch failed): '
'clears the lease, records p_error (when not NULL) as last_error, and either moves '
'dispatch_at to p_retry_at (attempts < max_attempts: it will be retried) or fails '
'the job (attempts >= max_attempts: failed, finished_at = now unless a cancel set it, '
'dispatch_at kept; never leased again). '
'Only while lease_holder = p_holder (expired or not; and, when p_lease_sequence '
'is given, lease_sequence = p_lease_sequence) and the job is not dispatched; else '
'false and nothing changes. The lease_sequence is kept: the next lease bumps it. '
'(A lease that expires without a release fails the job at the next job_lease instead.) '
'22023: p_error longer than 4096 characters.';

CREATE FUNCTION job_retry(p_run_id text, p_dispatch_at bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at       bigint;
    v_finished bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    v_at := coalesce(p_dispatch_at, now_ms());

    -- The finished_at it clears, for job_history (store_stats' counts).
    UPDATE jobs j
       SET failed = false,
           attempts = 0,
           dispatch_at = v_at,
           finished_at = NULL
      FROM (SELECT o.finished_at FROM jobs o WHERE o.run_id = p_run_id FOR UPDATE) AS o
     WHERE j.run_id = p_run_id
       AND j.failed
       AND NOT j.cancelled
       AND NOT j.dispatched
    RETURNING o.finished_at INTO v_finished;
    IF FOUND THEN
        PERFORM job_history_move(ARRAY[v_finished], ARRAY['failed'], NULL);
        PERFORM pg_notify(job_channel(), v_at::text);
        RETURN 'retried';
    ELSIF EXISTS (SELECT FROM jobs j WHERE j.run_id = p_run_id) THEN
        RETURN 'not_failed';
    END IF;
    RETURN 'missing';
END
$$;

COMMENT ON FUNCTION job_retry(text, bigint) IS
'Puts the failed job p_run_id back to waiting, due at p_dispatch_at (NULL: now_ms()): '
'failed cleared, attempts reset to 0, finished_at cleared; max_attempts, last_error '
'and lease_sequence kept. Answers ''retried'' (and, at commit, notifies job_channel() '
'with the new dispatch_at), ''not_failed'' (the job waits, was dispatched or was '
'cancelled: nothing changes) or ''missing''.';

CREATE FUNCTION job_cancel(p_run_id text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_dispatched boolean;
    v_cancelled  boolean;
    v_failed     boolean;
    v_finished   bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- The row lock orders this call against a concurrent job_mark_dispatched:
    -- it waits for that commit and then reads the dispatched row.
    SELECT j.dispatched, j.cancelled, j.failed, j.finished_at
      INTO v_dispatched, v_cancelled, v_failed, v_finished
      FROM jobs j
     WHERE j.run_id = p_run_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    ELSIF v_dispatched THEN
        RETURN 'already_dispatched';
    ELSIF NOT v_cancelled THEN
        UPDATE jobs
           SET cancelled = true,
               finished_at = coalesce(finished_at, now_ms())
         WHERE run_id = p_run_id;
        IF v_failed THEN  -- a failed job, finished already, now counts as cancelled
            PERFORM job_history_move(ARRAY[v_finished], ARRAY['failed'], ARRAY['cancelled']);
        END IF;
    END IF;
    RETURN 'cancelled';
END
$$;

COMMENT ON FUNCTION job_cancel(text) IS
'Cancels p_run_id: ''cancelled'' (also when it already was, when it failed, and when '
'a lease is live: its dispatcher learns it from job_mark_dispatched; the first cancel '
'sets finished_at to now unless a failure set it), ''already_dispatched'' '
'(nothing changes: the caller tells the bot to leave), or ''missing''.';

CREATE FUNCTION job_reschedule(
    p_run_id text, p_dispatch_at bigint, p_now bigint DEFAULT NULL
) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_present('dispatch_at', p_dispatch_at);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- Unlike job_schedule, which moves any existing job's dispatch_at, this
    -- moves only a job that can still be leased and that no one holds: a live
    -- lease's holder may be dispatching it at the old time. A concurrent lease
    -- or mark holds the row lock; this UPDATE waits for it and then tests the
    -- new row version, so it never moves a job leased or dispatched meanwhile.
    -- The expired lease's holder is cleared, so its late mark is refused.
    RETURN QUERY
    UPDATE jobs j
       SET dispatch_at = p_dispatch_at,
           lease_holder = NULL,
           lease_until = NULL
     WHERE j.run_id = p_run_id
       AND NOT j.dispatched
       AND NOT j.cancelled
       AND NOT j.failed
       AND (j.lease_until IS NULL OR j.lease_until <= v_now)
    RETURNING j.*;
    IF FOUND THEN
        PERFORM pg_notify(job_channel(), p_dispatch_at::text);
    END IF;
END
$$;

COMMENT ON FUNCTION job_reschedule(text, bigint, bigint) IS
'Moves the waiting job p_run_id to p_dispatch_at and returns it, when it is not '
'dispatched, cancelled or failed and holds no live lease at p_now (NULL: now_ms()); '
'an expired lease is cleared, so its holder can no longer mark or release it (attempts '
'and lease_sequence are kept). Otherwise returns no row and changes nothing: no such '
'job, a finished one, or one whose lease lives (its holder may be dispatching it). At '
'commit, notifies job_channel() with dispatch_at as the payload, as job_schedule does. '
'22023: p_dispatch_at NULL, or p_now past store_settings.max_clock_skew_ms.';

CREATE FUNCTION job_get(p_run_id text) RETURNS SETOF jobs
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_name('run_id', p_run_id);
    RETURN QUERY SELECT * FROM jobs WHERE run_id = p_run_id;
END
$$;

COMMENT ON FUNCTION job_get(text) IS
'The job p_run_id: zero or one row.';

CREATE FUNCTION job_list_dispatched() RETURNS SETOF jobs
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    RETURN QUERY SELECT * FROM jobs WHERE dispatched ORDER BY run_id;
END
$$;

COMMENT ON FUNCTION job_list_dispatched() IS
'Every dispatched job, ordered by run_id: what reconciliation compares with the '
'providers'' usage. Reads the whole table.';

CREATE FUNCTION job_remove(p_run_id text) RETURNS void
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

    -- One statement: the delete and the fence it raises (never lowers). A
    -- waiting job has no finished_at, so store_stats' history counts (job_history)
    -- never held it: nothing to forget there.
    WITH gone AS (
        DELETE FROM jobs j WHERE j.run_id = p_run_id RETURNING j.lease_sequence)
    UPDATE job_fences f
       SET lease_sequence = g.lease_sequence
      FROM gone g
     WHERE g.lease_sequence > f.lease_sequence;
END
$$;

COMMENT ON FUNCTION job_remove(text) IS
'Deletes the job p_run_id when it waits (not dispatched, cancelled or failed) and '
'holds no lease (lease_holder IS NULL: never leased, or released), and raises '
'job_fences.lease_sequence to its lease_sequence. Unknown run_id: nothing. A '
'dispatched, cancelled, failed or leased job (even one whose lease expired: its '
'dispatch may still be running): 55000 (object_not_in_prerequisite_state) naming its '
'state, and nothing changes; cancel it instead (job_cancel), and the owner deletes '
'finished jobs with job_purge.';

CREATE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now        bigint;
    v_deleted    bigint;
    v_finished   bigint[];
    v_kinds      text[];
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
        RETURNING j.lease_sequence, j.finished_at,
                  CASE WHEN j.dispatched AND j.cancelled THEN 'recalled'
                       WHEN j.dispatched THEN 'dispatched'
                       WHEN j.cancelled THEN 'cancelled'
                       ELSE 'failed' END AS kind),
    fenced AS (
        UPDATE job_fences f
           SET lease_sequence = g.top
          FROM (SELECT max(d.lease_sequence) AS top FROM gone d) g
         WHERE g.top > f.lease_sequence)
    SELECT count(*), array_agg(g.finished_at), array_agg(g.kind)
      INTO v_deleted, v_finished, v_kinds
      FROM gone g;
    PERFORM job_history_move(v_finished, v_kinds, NULL);  -- store_stats' counts
    RETURN v_deleted;
END
$$;

COMMENT ON FUNCTION job_purge(bigint, integer) IS
'Deletes at most p_limit finished jobs (dispatched, cancelled or failed) whose finished_at '
'< p_before, oldest first, and returns how many it deleted. Never a waiting job, '
'nor one whose lease is live; rows locked by concurrent calls are skipped (a purge '
'never waits on a lease, a mark or a cancel), so a short answer does not mean '
'nothing is left. Call it until it returns less than p_limit. Raises '
'job_fences.lease_sequence to the greatest lease_sequence it deleted, in the same '
'statement. 22023: p_before NULL or negative, p_limit NULL or not positive. Not '
'granted to the client role: it deletes history.';
