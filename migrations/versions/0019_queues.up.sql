-- pgstore 0019, upgrade: written by make revision from sql/; 0019_queues.py says what and why.

-- Table changes first: the functions below use them. Adding a column with a
-- constant default rewrites no row (PostgreSQL 11 and later); the new indexes are
-- built in this transaction (writes to jobs wait for it: seconds at a million
-- pending jobs).
ALTER TABLE store_settings
    ADD COLUMN max_payload_bytes integer NOT NULL DEFAULT 65536
        CHECK (max_payload_bytes > 0);
COMMENT ON COLUMN store_settings.max_payload_bytes IS
'The largest job payload job_schedule and job_schedule_many accept, in bytes of its '
'JSON text (64 KiB unless the owner changes it). Larger: 22023 naming payload '
'(payloads), nothing changes. Applies to payloads written after a change.';

ALTER TABLE jobs
    ADD COLUMN queue text COLLATE "C" NOT NULL DEFAULT 'default',
    ADD COLUMN priority integer NOT NULL DEFAULT 0,
    ADD COLUMN payload jsonb;

-- The waiting jobs split between two partial indexes, each job in exactly one
-- (sql/20_jobs.sql says why): the default group's (queue 'default', priority 0)
-- takes the name of the index of every pending job it replaces.
DROP INDEX jobs_pending_by_dispatch_at;
CREATE INDEX jobs_pending_by_dispatch_at ON jobs (dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed
      AND queue = 'default' AND priority = 0;
CREATE INDEX jobs_pending_by_queue ON jobs (queue, priority DESC, dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed
      AND (queue <> 'default' OR priority <> 0);

COMMENT ON INDEX jobs_pending_by_dispatch_at IS
'The lease path of the default group: the pending jobs in queue ''default'' at priority '
'0 only, in lease order, so the lease cost does not grow with dispatched, cancelled and '
'failed history (every other pending job: jobs_pending_by_queue).';
COMMENT ON INDEX jobs_pending_by_queue IS
'The lease path since pgstore_0019 of every pending job outside the default group '
'(queue ''default'', priority 0: jobs_pending_by_dispatch_at), by queue, priority '
'(highest first), dispatch_at and run_id. job_lease reads the due head of each (queue, '
'priority) group, so its cost depends on the number of groups, not on the backlog.';
COMMENT ON COLUMN jobs.queue IS
'The job''s queue (''default'' unless job_schedule was given one): job_lease and '
'job_lease_many lease from the queues their p_queues names (NULL: every queue).';
COMMENT ON COLUMN jobs.priority IS
'Higher is leased first among due jobs (then earliest dispatch_at, then run_id); 0 '
'unless job_schedule was given one.';
COMMENT ON COLUMN jobs.payload IS
'What the job carries for its dispatcher (any JSON, at most '
'store_settings.max_payload_bytes as JSON text), or NULL: none.';

CREATE TABLE queues (
    queue      text COLLATE "C" PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    updated_at bigint  NOT NULL
);

COMMENT ON TABLE queues IS
'The queue controls: one row per queue ever paused (queue_pause writes it, queue_resume '
'clears paused). Written only through those functions; a queue with no row is not paused.';
COMMENT ON COLUMN queues.paused IS
'True: job_lease and job_lease_many lease none of the queue''s jobs (leases already '
'held run on, and may be renewed, marked and released).';
COMMENT ON COLUMN queues.updated_at IS
'Epoch ms (the database clock) of the last queue_pause or queue_resume that changed the row.';

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

DROP FUNCTION job_schedule(text, bigint, integer);

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
'a backlog, a paused queue''s included. What job_lease_take reads first.';

CREATE FUNCTION job_lease_take(
    p_holder text, p_now bigint, p_until bigint, p_limit integer, p_queues text[]
) RETURNS SETOF jobs
LANGUAGE plpgsql
AS $$
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
$$;

COMMENT ON FUNCTION job_lease_take(text, bigint, bigint, integer, text[]) IS
'The lease of job_lease and job_lease_many (which check the arguments first) when some '
'pending job is outside the default group (queue ''default'', priority 0) or p_queues '
'names queues: leases to p_holder until p_until up to p_limit due jobs of the queues '
'p_queues names (NULL: every queue), highest priority first, then earliest dispatch_at, '
'then run_id, and returns them in that order; a job out of attempts is failed instead, '
'counted against p_limit and left out. With one (queue, priority) group leasable now, '
'one UPDATE that walks its due head; with several, one UPDATE a round: a second round '
'only when concurrent leasers held every row of a due head it read.';

DROP FUNCTION job_lease(text, bigint, bigint);

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

DROP FUNCTION job_schedule_many(text[], bigint[]);

CREATE FUNCTION job_schedule_many(
    p_run_ids text[], p_dispatch_at bigint[], p_queue text DEFAULT NULL,
    p_priority integer DEFAULT NULL, p_payloads jsonb[] DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_max integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_same_length('dispatch_at', p_dispatch_at, cardinality(p_run_ids));
    IF array_position(p_dispatch_at, NULL) IS NOT NULL THEN
        PERFORM raise_invalid('dispatch_at must not hold a null');
    END IF;
    IF p_queue IS NOT NULL THEN
        PERFORM check_name('queue', p_queue);
    END IF;
    IF p_payloads IS NOT NULL THEN
        PERFORM check_same_length('payloads', p_payloads, cardinality(p_run_ids));
        SELECT s.max_payload_bytes INTO v_max FROM store_settings s;
        IF EXISTS (SELECT FROM unnest(p_payloads) AS u(p) WHERE octet_length(p::text) > v_max)
        THEN
            PERFORM raise_invalid(format(
                'payloads must hold payloads of at most %s bytes as JSON text '
                '(store_settings.max_payload_bytes)', v_max));
        END IF;
    END IF;
    IF cardinality(p_run_ids) = 0 THEN
        RETURN;
    END IF;

    -- queue, priority and each payload as job_schedule takes them: NULL is the
    -- default for a new job and keeps an existing job's own.
    BEGIN
        INSERT INTO jobs AS j (run_id, dispatch_at, max_attempts, queue, priority, payload)
        SELECT u.run_id, u.dispatch_at,
               (SELECT s.default_max_attempts FROM store_settings s),
               coalesce(p_queue, 'default'), coalesce(p_priority, 0), u.payload
          FROM unnest(p_run_ids, p_dispatch_at,
                      coalesce(p_payloads,
                               array_fill(NULL::jsonb, ARRAY[cardinality(p_run_ids)])))
               AS u(run_id, dispatch_at, payload)
         ORDER BY u.run_id  -- one lock order for every batch
        ON CONFLICT (run_id) DO UPDATE
            SET dispatch_at = excluded.dispatch_at,
                queue = coalesce(p_queue, j.queue),
                priority = coalesce(p_priority, j.priority),
                payload = coalesce(excluded.payload, j.payload);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'run_ids holds a run_id too long to index: at most about 2700 '
                      'bytes of UTF-8 each';
    END;

    -- One notification for the batch: the earliest time, what wakes a dispatcher soonest.
    PERFORM pg_notify(job_channel(), (SELECT min(d) FROM unnest(p_dispatch_at) AS u(d))::text);
END
$$;

COMMENT ON FUNCTION job_schedule_many(text[], bigint[], text, integer, jsonb[]) IS
'job_schedule (without p_max_attempts) for each (p_run_ids[i], p_dispatch_at[i]), '
'in one INSERT: adds the jobs with store_settings.default_max_attempts, in queue p_queue '
'at priority p_priority (NULL: ''default'', 0), each carrying p_payloads[i] (p_payloads '
'NULL: none); for existing ones moves dispatch_at and replaces queue, priority and '
'payload only where given (not NULL), as job_schedule does. At commit, notifies '
'job_channel() once, with the earliest dispatch_at as the payload (nothing for '
'empty arrays). 22023 and nothing changes: run_ids NULL, longer than batch_max(), '
'with a NULL, empty, too long or repeated id; dispatch_at NULL, not as long, or '
'holding a NULL; queue empty or longer than 1024 characters; payloads not as long, or '
'holding one longer than store_settings.max_payload_bytes as JSON text.';

DROP FUNCTION job_lease_many(text, bigint, bigint, integer);

CREATE FUNCTION job_lease_many(
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
$$;

COMMENT ON FUNCTION job_lease_many(text, bigint, bigint, integer, text[]) IS
'job_lease for up to p_limit jobs at once: leases to p_holder, until now + p_ttl_ms, '
'the next due, uncancelled, undispatched, unfailed jobs whose lease is absent or '
'expired, of the queues p_queues names (NULL, the default: every queue), in lease '
'order (priority highest first, then dispatch_at, then run_id), bumping each one''s '
'lease_sequence and adding one to its attempts as job_lease does. A job among them '
'with attempts >= max_attempts (its last lease expired without a release) is failed '
'instead, as job_lease fails it, and not returned. Returns the leased jobs in that '
'order: fewer than p_limit (none) when no more are leasable right now, or when some '
'were failed; rows locked by concurrent leasers are skipped. '
'22023: p_limit NULL, not positive or above batch_max(), and job_lease''s rules.';

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
RETURNS TABLE (queue text, depth bigint, due bigint, leased bigint, paused boolean)
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
    SELECT coalesce(c.queue, s.queue), coalesce(c.depth, 0), coalesce(c.due, 0),
           coalesce(c.leased, 0), coalesce(s.paused, false)
      FROM counts c
      FULL JOIN queues s ON s.queue = c.queue
     ORDER BY 1;
END
$$;

COMMENT ON FUNCTION queue_list(bigint) IS
'One row per queue that holds waiting jobs or was ever paused, by name: depth (jobs '
'waiting: not dispatched, cancelled or failed), due (of those, due at p_now, NULL '
'meaning now_ms(), and not held by a live lease: what a lease could take), leased (held '
'by a live lease at p_now) and paused. Reads every waiting job, never the history. '
'22023: p_now past store_settings.max_clock_skew_ms.';

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
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
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
'The waiting counts read the two pending indexes; the history counts read job_history, the '
'jobs finished since its upto and the small index of recalled and failed jobs, never '
'the rest of the history (the schedules are scanned). On a primary, under READ '
'COMMITTED and not read-only, it first moves job_history forward '
'(job_history_advance): VOLATILE, and it may write that one row.';

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
                UNION ALL
                SELECT q.*
                  FROM jobs q
                 WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                   AND (q.queue <> 'default' OR q.priority <> 0)
                   AND q.dispatch_at <= v_now) AS j
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
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM jobs j
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$$;

COMMENT ON FUNCTION job_list(text, bigint, integer) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects, with the columns of the jobs table in its order, each row then carrying how '
'many match in all (matching). p_filter: ''all''; '
'''due'' (waiting and due at p_now, NULL meaning now_ms(), leased or not); '
'''dispatched''; ''failed'' (out of attempts and not cancelled: what job_retry takes '
'back). The operator''s view of the table (pgstore jobs); 22023 for another '
'filter or a p_limit that is not positive.';

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
