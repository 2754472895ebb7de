-- pgstore: the job store's batch calls, for bursts (every bot of the 10:00
-- meetings due in the same second).
--
-- Each writes with one statement over many jobs, with the per-job meaning of
-- its single-job function in 21_job_functions.sql: a dispatcher that leases,
-- marks or renews a hundred jobs pays one round trip and one commit instead
-- of a hundred. The arrays are checked whole (a bad element raises 22023 and
-- changes nothing; job_mark_dispatched_many finds a repeated run_id after its
-- UPDATE, which the raise undoes): one dimension, at most
-- batch_max() elements, run ids non-empty, at most 1024 characters and
-- distinct, companion arrays of the same length. A job costs about the same
-- at any batch size, whatever plan the planner picks: a job's own arguments
-- and answer are looked up by run_id (in jsonb objects, a binary search),
-- never found by joining the input arrays to the rows.

CREATE FUNCTION batch_max() RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$ SELECT 10000 $$;

COMMENT ON FUNCTION batch_max() IS
'The most jobs one batch call takes (p_limit of job_lease_many, the length of the '
'arrays of job_schedule_many, job_mark_dispatched_many and job_renew_many): 10000.';

CREATE FUNCTION check_run_ids(p_run_ids text[]) RETURNS void
LANGUAGE plpgsql
AS $$
-- VOLATILE (the default), as raise_invalid: it raises for some constant input.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    IF p_run_ids IS NULL THEN
        PERFORM raise_invalid('run_ids must not be null');
    ELSIF array_ndims(p_run_ids) > 1 OR cardinality(p_run_ids) > batch_max() THEN
        PERFORM raise_invalid(format(
            'run_ids must be a one-dimensional array of at most %s elements', batch_max()));
    ELSIF EXISTS (SELECT FROM unnest(p_run_ids) AS u(r)
                   WHERE r IS NULL OR r = '' OR length(r) > 1024) THEN
        PERFORM raise_invalid(
            'run_ids must hold non-empty strings of at most 1024 characters');
    ELSIF (SELECT count(DISTINCT r) FROM unnest(p_run_ids) AS u(r)) < cardinality(p_run_ids) THEN
        PERFORM raise_invalid('run_ids must not repeat a run_id');
    END IF;
END
$$;

COMMENT ON FUNCTION check_run_ids(text[]) IS
'Raises 22023 naming run_ids unless p_run_ids is a one-dimensional array of at most '
'batch_max() distinct, non-empty strings of at most 1024 characters (empty is fine).';

CREATE FUNCTION check_same_length(p_param text, p_value anyarray, p_length integer)
RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    IF p_value IS NULL OR array_ndims(p_value) > 1 OR cardinality(p_value) <> p_length THEN
        PERFORM raise_invalid(format(
            '%s must be a one-dimensional array as long as run_ids', p_param));
    END IF;
END
$$;

COMMENT ON FUNCTION check_same_length(text, anyarray, integer) IS
'Raises 22023 naming p_param unless p_value is a one-dimensional array of p_length '
'elements (NULL elements pass: each caller says what they mean).';

CREATE FUNCTION check_lease_sequences(p_value bigint[], p_length integer) RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    IF p_value IS NOT NULL THEN
        PERFORM check_same_length('lease_sequences', p_value, p_length);
        IF EXISTS (SELECT FROM unnest(p_value) AS u(s) WHERE s <= 0) THEN
            PERFORM raise_invalid('lease_sequences must hold positive integers or nulls');
        END IF;
    END IF;
END
$$;

COMMENT ON FUNCTION check_lease_sequences(bigint[], integer) IS
'Raises 22023 naming lease_sequences unless p_value is NULL (no fences) or a '
'one-dimensional array of p_length elements, each NULL (no fence) or positive.';

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

CREATE FUNCTION job_mark_dispatched_many(
    p_run_ids text[], p_holder text, p_worker_ids text[],
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_worker_ids jsonb;       -- run_id -> worker_id
    v_fences     jsonb;       -- run_id -> lease_sequence; NULL when no array is given
    v_ids        text[];      -- the jobs the UPDATE recorded
    v_flags      boolean[];   -- and their cancelled flags
    v_marked     jsonb;       -- run_id -> cancelled, when some job was not recorded
    v_finished   bigint[];    -- the finished_at of the jobs this call recalled
    v_again      text[];      -- recalled jobs marked again by their holder
BEGIN
    PERFORM check_primary();
    -- Well-formed input costs one pass over the arrays, with no sort: every
    -- rule but "distinct" at once. Any doubt runs the checks one by one, in
    -- their order, for the first rule broken and its message. Distinct run ids
    -- are proven below, for free, when every job was recorded; otherwise
    -- check_run_ids raises for a repeat after the UPDATE, and the raise undoes
    -- it (nothing changes).
    IF p_run_ids IS NULL OR array_ndims(p_run_ids) > 1 OR cardinality(p_run_ids) > batch_max()
       OR p_holder IS NULL OR p_holder = '' OR length(p_holder) > 1024
       OR p_worker_ids IS NULL OR array_ndims(p_worker_ids) > 1
       OR cardinality(p_worker_ids) <> cardinality(p_run_ids)
       OR (p_lease_sequences IS NOT NULL
           AND (array_ndims(p_lease_sequences) > 1
                OR cardinality(p_lease_sequences) <> cardinality(p_run_ids)))
       OR EXISTS (SELECT FROM unnest(p_run_ids, p_worker_ids, p_lease_sequences) AS u(r, w, s)
                   WHERE r IS NULL OR r = '' OR length(r) > 1024 OR length(w) > 1024
                      OR s <= 0) THEN
        PERFORM check_run_ids(p_run_ids);
        PERFORM check_name('holder', p_holder);
        PERFORM check_same_length('worker_ids', p_worker_ids, cardinality(p_run_ids));
        IF EXISTS (SELECT FROM unnest(p_worker_ids) AS u(w) WHERE length(w) > 1024) THEN
            PERFORM raise_invalid('worker_ids must hold strings of at most 1024 characters');
        END IF;
        PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    END IF;

    -- Each job's own arguments are looked up by run_id in a jsonb object, not
    -- joined to the rows: jsonb keeps an object's keys sorted, so ->> is a
    -- binary search, and the call's cost grows with the batch, not with its
    -- square, whatever plan the planner picks. (Until pgstore_0013 they were
    -- a join with unnest(), which the generic plan plpgsql caches after five
    -- calls, estimating 10 input rows and 1 match, ran as a nested loop that
    -- rescanned the whole input for every job: "Rows Removed by Join Filter:
    -- 9900" for 100 jobs. A hash join, forced, costs as much as the lookups.)
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
    --
    -- A job already recalled (dispatched and cancelled) is left out, as
    -- job_mark_dispatched leaves it: a cancelled job answered here was recalled
    -- by this very call.
    --
    -- The clock is read once, by the first row the statement writes (an
    -- InitPlan, not now_ms()'s numeric arithmetic for every job): that row's
    -- write then takes the transaction's id, so, as with a clock read for
    -- each row, no job gets a finished_at older than the moment this
    -- transaction became visible as running (what job_history_advance's
    -- proposals wait on).
    WITH marked AS (
        UPDATE jobs j
           SET dispatched = true,
               worker_id = v_worker_ids ->> j.run_id,
               finished_at = coalesce(j.finished_at, (SELECT now_ms()))
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
           AND NOT (j.dispatched AND j.cancelled)
        RETURNING j.run_id, j.cancelled)
    SELECT array_agg(m.run_id), array_agg(m.cancelled)
      INTO v_ids, v_flags  -- NULL when nothing was recorded
      FROM marked m;

    -- One row per job, in the order given. Every job recorded (each row is
    -- updated once, so as many rows as run ids means they are distinct) and
    -- none cancelled, the common case: (run_id, false, true) for each, with
    -- no lookup.
    IF cardinality(v_ids) = cardinality(p_run_ids) THEN
        IF array_position(v_flags, true) IS NULL THEN
            RETURN QUERY SELECT u.run_id, false, true FROM unnest(p_run_ids) AS u(run_id);
            RETURN;
        END IF;
    ELSE
        PERFORM check_run_ids(p_run_ids);  -- a repeated run_id raises here
    END IF;

    -- The jobs this call recalled (cancelled before their mark): store_stats'
    -- history is told, once, with each cancel's finished_at (kept by the mark).
    IF array_position(v_flags, true) IS NOT NULL THEN
        SELECT array_agg(j.finished_at) INTO v_finished
          FROM unnest(v_ids, v_flags) AS u(run_id, cancelled)
          JOIN jobs j ON j.run_id = u.run_id
         WHERE u.cancelled;
        PERFORM job_history_move(v_finished,
                                 array_fill('cancelled'::text, ARRAY[cardinality(v_finished)]),
                                 array_fill('recalled'::text, ARRAY[cardinality(v_finished)]));
    END IF;

    -- A recalled job marked again by its holder: the worker recorded again, as
    -- job_mark_dispatched does (the UPDATE above left it out).
    IF cardinality(v_ids) IS DISTINCT FROM cardinality(p_run_ids) THEN
        WITH again AS (
            UPDATE jobs j
               SET worker_id = v_worker_ids ->> j.run_id
             WHERE j.run_id = ANY (p_run_ids)
               AND j.lease_holder = p_holder
               AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint,
                                               j.lease_sequence)
               AND j.dispatched AND j.cancelled
               AND NOT (j.run_id = ANY (coalesce(v_ids, '{}')))
            RETURNING j.run_id)
        SELECT array_agg(a.run_id) INTO v_again FROM again a;
        v_ids := v_ids || v_again;
        v_flags := v_flags || array_fill(true, ARRAY[coalesce(cardinality(v_again), 0)]);
    END IF;

    -- Otherwise a recorded job answers the flag its UPDATE returned. The others
    -- (another holder or lease took the job, or it is gone) answer the stored
    -- flag, read as job_mark_dispatched reads it: by a statement of its own
    -- after the UPDATE (under READ COMMITTED, as committed by then), through
    -- the primary key; false for a missing job.
    v_marked := jsonb_object(v_ids, v_flags::text[]);
    RETURN QUERY
    SELECT u.run_id,
           coalesce((v_marked ->> u.run_id)::boolean,
                    (SELECT s.cancelled FROM jobs s WHERE s.run_id = u.run_id),
                    false),
           (v_marked ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

COMMENT ON FUNCTION job_mark_dispatched_many(text[], text, text[], bigint[]) IS
'job_mark_dispatched for each p_run_ids[i] by p_holder with p_worker_ids[i] (NULL '
'allowed), fenced by p_lease_sequences[i] when that array and that element are not '
'NULL: one row (run_id, cancelled, recorded) per job, in the order given, each with '
'job_mark_dispatched''s meaning (recorded = false: another holder or lease took the '
'job, or it is gone, and nothing changed for it). One UPDATE. 22023 and nothing '
'changes: run_ids as job_schedule_many says, worker_ids NULL, not as long or with '
'an element over 1024 characters, lease_sequences not as long or with an element '
'that is not positive.';

CREATE FUNCTION job_renew_many(
    p_run_ids text[], p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, renewed boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_fences  jsonb;  -- run_id -> lease_sequence; NULL when no array is given
    v_renewed jsonb;  -- run_id -> true, for the leases the UPDATE extended
    v_queues    text[];
    v_limited   text[];  -- the renewed leases of queues with a concurrency limit
    v_sequences bigint[];
    v_lost      text[];
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

    -- As job_renew: the leases of queues with a concurrency limit keep their
    -- places in queue_slots, or end (sql/24_queue_limits.sql).
    WITH renewed AS (
        UPDATE jobs j
           SET lease_until = v_until
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_until > v_now
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
        RETURNING j.run_id, j.queue, j.lease_sequence)
    SELECT jsonb_object(array_agg(r.run_id), array_agg('true'::text)),
           array_agg(r.queue) FILTER (WHERE q.concurrency_limit IS NOT NULL),
           array_agg(r.run_id) FILTER (WHERE q.concurrency_limit IS NOT NULL),
           array_agg(r.lease_sequence) FILTER (WHERE q.concurrency_limit IS NOT NULL)
      INTO v_renewed, v_queues, v_limited, v_sequences  -- NULL when no lease was extended
      FROM renewed r
      LEFT JOIN queues q ON q.queue = r.queue;
    IF v_limited IS NOT NULL THEN
        v_lost := queue_limits_keep(v_queues, v_limited, v_sequences, v_now, v_until);
        IF cardinality(v_lost) > 0 THEN
            -- Their queue is full and they hold none of its rows: they end now.
            UPDATE jobs j SET lease_until = v_now WHERE j.run_id = ANY (v_lost);
            v_renewed := v_renewed - v_lost;
        END IF;
    END IF;

    RETURN QUERY
    SELECT u.run_id, (v_renewed ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

COMMENT ON FUNCTION job_renew_many(text[], text, bigint, bigint, bigint[]) IS
'job_renew for each p_run_ids[i] by p_holder, fenced by p_lease_sequences[i] when '
'that array and that element are not NULL: one row (run_id, renewed) per job, in the '
'order given; renewed = false means that lease was lost and its holder must stop. '
'One UPDATE. 22023 and nothing changes: run_ids as job_schedule_many says, '
'lease_sequences not as long or with an element that is not positive, and '
'job_renew''s rules for p_holder, p_now and p_ttl_ms.';
