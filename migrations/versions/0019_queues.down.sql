-- pgstore 0019, downgrade: written by make revision from sql/; 0019_queues.py says what and why.

DROP FUNCTION job_lease(text, bigint, bigint, text[]);

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint)
 RETURNS SETOF jobs
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The scalar subquery on run_id is an InitPlan: it runs once, walks the
    -- pending index in lease order and locks one row, skipping rows that
    -- concurrent leasers hold locked. The one on job_fences is read in this
    -- statement, with its snapshot: a row visible to it was scheduled after
    -- any purge or remove of its run_id that the mark must cover. token_floor()
    -- is inlined: store_epoch is read once, by another InitPlan, only when a
    -- job is leased.
    --
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned: the call then
    -- answers no row, and the next call leases the next job.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1,
                                                   token_floor_at((SELECT e.epoch
                                                                     FROM store_epoch e)),
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = (
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched
                      AND NOT c.cancelled
                      AND NOT c.failed
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT 1
                      FOR UPDATE SKIP LOCKED)
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed;
END
$function$;

COMMENT ON FUNCTION job_lease(text, bigint, bigint) IS
'Leases to p_holder, until now + p_ttl_ms, the next due (dispatch_at <= now), '
'uncancelled, undispatched, unfailed job whose lease is absent or expired, earliest '
'dispatch_at first (ties by run_id), bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline, and above '
'job_fences.lease_sequence: above every lease of a deleted job) and adds one to its '
'attempts. Returns it, with the new lease_sequence and attempts, or no row. A job is '
'leased at most max_attempts times: when that next job has attempts >= max_attempts '
'(its last lease expired without a release) it is failed instead (failed, '
'finished_at = now_ms(), lease cleared, last_error says why) and no row is returned. '
'One UPDATE; rows locked by concurrent leasers are skipped, so an empty answer means '
'nothing leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives. 22023: p_ttl_ms above store_settings.max_lease_ms.';

REVOKE ALL ON FUNCTION job_lease(text, bigint, bigint) FROM PUBLIC;

DROP FUNCTION job_schedule(text, bigint, integer, text, integer, jsonb);

CREATE OR REPLACE FUNCTION job_schedule(p_run_id text, p_dispatch_at bigint, p_max_attempts integer DEFAULT NULL::integer)
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_present('dispatch_at', p_dispatch_at);
    IF p_max_attempts IS NOT NULL THEN
        PERFORM check_positive('max_attempts', p_max_attempts);
    END IF;

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO jobs AS j (run_id, dispatch_at, max_attempts)
        VALUES (p_run_id, p_dispatch_at,
                coalesce(p_max_attempts,
                         (SELECT s.default_max_attempts FROM store_settings s)))
        ON CONFLICT (run_id) DO UPDATE
            SET dispatch_at = excluded.dispatch_at,
                max_attempts = coalesce(p_max_attempts, j.max_attempts);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'run_id is too long to index: at most about 2700 bytes of UTF-8';
    END;

    -- Delivered at commit. Only scheduling notifies: a NOTIFY on the lease,
    -- renew or dispatch path would serialise every commit in the database.
    PERFORM pg_notify(job_channel(), p_dispatch_at::text);
END
$function$;

COMMENT ON FUNCTION job_schedule(text, bigint, integer) IS
'Adds the job p_run_id, due at p_dispatch_at, with at most p_max_attempts leases '
'(NULL: store_settings.default_max_attempts, 25 unless the owner changed it). For an '
'existing job moves only dispatch_at, and max_attempts when p_max_attempts is given: '
'lease, attempts, worker_id, dispatched, cancelled and failed are preserved. At '
'commit, notifies job_channel() with dispatch_at as the payload. 22023: '
'p_max_attempts not positive.';

REVOKE ALL ON FUNCTION job_schedule(text, bigint, integer) FROM PUBLIC;

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
              FROM jobs j
             WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed) AS w
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
           (SELECT j.run_id, j.dispatch_at
              FROM jobs j
             WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
               AND j.dispatch_at <= v_now
               AND (j.lease_until IS NULL OR j.lease_until <= v_now)
             ORDER BY j.dispatch_at, j.run_id
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
'read the pending index; the history counts read job_history, the jobs finished '
'since its upto and the small index of recalled and failed jobs, never the rest of '
'the history (the schedules are scanned). On a primary, under READ COMMITTED and not '
'read-only, it first moves job_history forward (job_history_advance): VOLATILE, and '
'it may write that one row.';

DROP FUNCTION job_schedule_many(text[], bigint[], text, integer, jsonb[]);

CREATE OR REPLACE FUNCTION job_schedule_many(p_run_ids text[], p_dispatch_at bigint[])
 RETURNS void
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_same_length('dispatch_at', p_dispatch_at, cardinality(p_run_ids));
    IF array_position(p_dispatch_at, NULL) IS NOT NULL THEN
        PERFORM raise_invalid('dispatch_at must not hold a null');
    END IF;
    IF cardinality(p_run_ids) = 0 THEN
        RETURN;
    END IF;

    BEGIN
        INSERT INTO jobs AS j (run_id, dispatch_at, max_attempts)
        SELECT u.run_id, u.dispatch_at,
               (SELECT s.default_max_attempts FROM store_settings s)
          FROM unnest(p_run_ids, p_dispatch_at) AS u(run_id, dispatch_at)
         ORDER BY u.run_id  -- one lock order for every batch
        ON CONFLICT (run_id) DO UPDATE
            SET dispatch_at = excluded.dispatch_at;
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'run_ids holds a run_id too long to index: at most about 2700 '
                      'bytes of UTF-8 each';
    END;

    -- One notification for the batch: the earliest time, what wakes a dispatcher soonest.
    PERFORM pg_notify(job_channel(), (SELECT min(d) FROM unnest(p_dispatch_at) AS u(d))::text);
END
$function$;

COMMENT ON FUNCTION job_schedule_many(text[], bigint[]) IS
'job_schedule (without p_max_attempts) for each (p_run_ids[i], p_dispatch_at[i]), in '
'one INSERT: adds the jobs with store_settings.default_max_attempts, and for '
'existing ones moves only dispatch_at. At commit, notifies job_channel() once, with '
'the earliest dispatch_at as the payload (nothing for empty arrays). 22023 and '
'nothing changes: run_ids NULL, longer than batch_max(), with a NULL, empty, too '
'long or repeated id; dispatch_at NULL, not as long, or holding a NULL.';

REVOKE ALL ON FUNCTION job_schedule_many(text[], bigint[]) FROM PUBLIC;

DROP FUNCTION job_lease_many(text, bigint, bigint, integer, text[]);

CREATE OR REPLACE FUNCTION job_lease_many(p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer)
 RETURNS SETOF jobs
 LANGUAGE plpgsql
 SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_positive('limit', p_limit);
    IF p_limit > batch_max() THEN
        PERFORM raise_invalid(format('limit must be at most %s', batch_max()));
    END IF;
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps
    -- token_floor() once per call, not once per row: inlined in a scalar
    -- subquery, an InitPlan (bare in the SET list it read the WAL position for
    -- every job). One value is right for the whole batch: a primary writes on
    -- one timeline for as long as it runs, check_primary() above has refused
    -- a standby, and store_epoch is read in the statement's snapshot.

    -- job_lease's walk with LIMIT p_limit: the ARRAY() subquery is an InitPlan
    -- that runs once, walks the pending index in lease order and locks up to
    -- p_limit rows, skipping rows concurrent leasers hold locked; the UPDATE then
    -- reaches them through the primary key (an IN would let the planner hash-join
    -- a scan of the whole table). The answer comes back in lease order.
    --
    -- job_lease's rules for each job: job_fences is read by this statement (an
    -- InitPlan, once), never by an earlier one, and a job out of attempts is
    -- failed by this UPDATE instead of leased, and left out of the answer, so
    -- it may hold fewer than p_limit rows.
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
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
         WHERE j.run_id = ANY (ARRAY(
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched
                      AND NOT c.cancelled
                      AND NOT c.failed
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
END
$function$;

COMMENT ON FUNCTION job_lease_many(text, bigint, bigint, integer) IS
'job_lease for up to p_limit jobs at once: leases to p_holder, until now + p_ttl_ms, '
'the next due, uncancelled, undispatched, unfailed jobs whose lease is absent or '
'expired, in lease order (dispatch_at, then run_id), bumping each one''s '
'lease_sequence and adding one to its attempts as job_lease does. A job among them '
'with attempts >= max_attempts (its last lease expired without a release) is failed '
'instead, as job_lease fails it, and not returned. Returns the leased jobs in that '
'order: fewer than p_limit (none) when no more are leasable right now, or when some '
'were failed; rows locked by concurrent leasers are skipped. One UPDATE. 22023: '
'p_limit NULL, not positive or above batch_max(), and job_lease''s rules.';

REVOKE ALL ON FUNCTION job_lease_many(text, bigint, bigint, integer) FROM PUBLIC;

DROP FUNCTION job_list(text, bigint, integer);

CREATE OR REPLACE FUNCTION job_list(p_filter text, p_now bigint, p_limit integer)
 RETURNS TABLE(run_id text, dispatch_at bigint, lease_holder text, lease_until bigint, worker_id text, dispatched boolean, cancelled boolean, lease_sequence bigint, finished_at bigint, attempts integer, max_attempts integer, last_error text, failed boolean, matching bigint)
 LANGUAGE plpgsql
 STABLE SECURITY DEFINER
 SET search_path FROM CURRENT
AS $function$
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
               j.max_attempts, j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
           AND j.dispatch_at <= v_now
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'dispatched' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'failed' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$function$;

COMMENT ON FUNCTION job_list(text, bigint, integer) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects, with the columns of the jobs table in its order, each row then carrying '
'how many match in all (matching). p_filter: ''all''; ''due'' (waiting and due at p_now, '
'NULL meaning now_ms(), leased or not); ''dispatched''; ''failed'' (out of attempts and '
'not cancelled: what job_retry takes back). The operator''s view of the table '
'(pgstore jobs); 22023 for another filter or a p_limit that is not positive.';

REVOKE ALL ON FUNCTION job_list(text, bigint, integer) FROM PUBLIC;

DROP FUNCTION queue_list(bigint);

DROP FUNCTION queue_resume(text);

DROP FUNCTION queue_pause(text);

DROP FUNCTION job_lease_take(text, bigint, bigint, integer, text[]);

DROP FUNCTION job_lease_groups(text[]);

DROP FUNCTION check_queues(text[]);

DROP FUNCTION check_payload(text, jsonb);

DROP TABLE queues;
-- Table changes last: the functions above no longer use them.
DROP INDEX jobs_pending_by_queue;
DROP INDEX jobs_pending_by_dispatch_at;
CREATE INDEX jobs_pending_by_dispatch_at ON jobs (dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed;
COMMENT ON INDEX jobs_pending_by_dispatch_at IS
'The lease path: pending jobs only, in lease order, so the lease cost does not grow '
'with dispatched, cancelled and failed history.';
ALTER TABLE jobs DROP COLUMN queue, DROP COLUMN priority, DROP COLUMN payload;
ALTER TABLE store_settings DROP COLUMN max_payload_bytes;
