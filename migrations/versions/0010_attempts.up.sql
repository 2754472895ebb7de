-- pgstore 0010, upgrade: attempts, failed jobs, and a schedule's failures in a row.
--
-- * jobs.attempts (0 for the jobs already stored: counted from this revision on)
--   is bumped by every job_lease; jobs.max_attempts (25, the store default,
--   for the jobs already stored) bounds it; jobs.last_error keeps the p_error of the
--   latest job_release that gave one; jobs.failed is the terminal state a
--   job_release reaches when attempts >= max_attempts. A failed job is never
--   leased again: the pending index leaves failed jobs out (rebuilt here).
-- * store_settings.default_max_attempts (25): what job_schedule stores when it
--   is called without p_max_attempts. The owner changes it with a plain UPDATE.
-- * job_retry(p_run_id, p_dispatch_at) puts a failed job back to waiting
--   (granted to the client role); job_list takes the filter 'failed' and
--   returns the new columns; store_stats counts jobs_failed.
-- * schedules.consecutive_failures: schedule_complete adds one for 'error' and
--   resets it for 'ok'. A schedule whose last completion was an error starts
--   at 1 (the store never counted more), the others at 0.
-- * job_schedule and job_release take an optional last argument (DEFAULT NULL:
--   calls without it behave as before); store_stats and job_list return new
--   columns. Those four are dropped and created again, and whoever could
--   execute one may execute it again; everything else is CREATE OR REPLACE,
--   which keeps owners and grants.

ALTER TABLE store_settings
    ADD COLUMN default_max_attempts integer NOT NULL DEFAULT 25
        CHECK (default_max_attempts > 0);

COMMENT ON COLUMN store_settings.default_max_attempts IS
'How many leases a job scheduled without p_max_attempts may have (25 unless the '
'owner changes it): job_schedule copies it into the new job''s max_attempts, so a '
'change applies to the jobs scheduled after it.';

ALTER TABLE jobs
    ADD COLUMN attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 25 CHECK (max_attempts > 0),
    ADD COLUMN last_error text,
    ADD COLUMN failed boolean NOT NULL DEFAULT false;

DROP INDEX jobs_pending_by_dispatch_at;

CREATE INDEX jobs_pending_by_dispatch_at ON jobs (dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed;

COMMENT ON TABLE jobs IS
'Delayed dispatch with holder leases ("send a bot into meeting R at 10:00"). '
'Written only through the job_* functions; dispatched, cancelled and failed jobs are '
'kept until job_purge deletes them.';
COMMENT ON COLUMN jobs.finished_at IS
'Epoch ms (the database clock) when the job finished: set by job_mark_dispatched, '
'by job_cancel of an undispatched job and by the job_release that fails it, once; '
'NULL while the job waits (job_retry clears it). '
'Jobs finished before pgstore_0009 got the time of that upgrade.';
COMMENT ON COLUMN jobs.attempts IS
'How many times the job was leased since it was scheduled (or retried): every '
'job_lease adds one, job_retry resets it to 0. Counted from pgstore_0010 on.';
COMMENT ON COLUMN jobs.max_attempts IS
'The most leases the job may have: a job_release once attempts >= max_attempts fails '
'the job. job_schedule''s p_max_attempts, or store_settings.default_max_attempts '
'when the job was scheduled without one (job_schedule always writes it: the column''s '
'own default, 25, is for rows written otherwise).';
COMMENT ON COLUMN jobs.last_error IS
'The p_error of the latest job_release that gave one (at most 4096 characters); '
'NULL until then.';
COMMENT ON COLUMN jobs.failed IS
'Terminal: set by the job_release that found attempts >= max_attempts. A failed job '
'is never leased again; job_retry puts it back to waiting, job_purge deletes it.';
COMMENT ON INDEX jobs_pending_by_dispatch_at IS
'The lease path: pending jobs only, in lease order, so the lease cost does not grow '
'with dispatched, cancelled and failed history.';

ALTER TABLE schedules
    ADD COLUMN consecutive_failures integer NOT NULL DEFAULT 0
        CHECK (consecutive_failures >= 0);

UPDATE schedules SET consecutive_failures = 1 WHERE last_status = 'error';

COMMENT ON COLUMN schedules.consecutive_failures IS
'How many completions in a row said last_status = ''error'': schedule_complete adds one '
'for an error and resets it to 0 for ''ok''. Kept by a re-register, 0 for a new id.';

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0010'::text $$;

CREATE OR REPLACE FUNCTION schedule_complete(
    p_id text, p_fencing_token bigint, p_next_run_at bigint,
    p_last_run_at bigint, p_last_status text, p_now bigint DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now       bigint;
    v_completed boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_present('fencing_token', p_fencing_token);
    PERFORM check_present('last_run_at', p_last_run_at);
    PERFORM check_one_of('last_status', p_last_status, ARRAY['ok', 'error']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    UPDATE schedules s
       SET next_run_at = p_next_run_at,
           last_run_at = p_last_run_at,
           last_status = p_last_status,
           consecutive_failures = CASE WHEN p_last_status = 'ok' THEN 0
                                       ELSE least(s.consecutive_failures, 2147483646) + 1 END,
           lease_owner = NULL,
           lease_until = NULL,
           updated_at = v_now
     WHERE id = p_id
       AND fencing_token = p_fencing_token
       AND lease_owner IS NOT NULL
    RETURNING true INTO v_completed;
    RETURN coalesce(v_completed, false);
END
$$;

COMMENT ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) IS
'Commits an occurrence only if p_fencing_token matches and the claim is still '
'held: writes next_run_at (NULL = tombstone), last_run_at and last_status, '
'adds one to consecutive_failures for ''error'' (reset to 0 for ''ok''), '
'clears the lease, updated_at = now. False when stale (claimed again since), '
'already completed, re-registered or deleted; then nothing changes.';

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The scalar subquery is an InitPlan: it runs once, walks the pending
    -- index in lease order and locks one row, skipping rows that concurrent
    -- leasers hold locked.
    RETURN QUERY
    UPDATE jobs j
       SET lease_holder = p_holder,
           lease_until = v_until,
           lease_sequence = greatest(j.lease_sequence + 1, token_floor()),
           attempts = j.attempts + 1
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
    RETURNING j.*;
END
$$;

COMMENT ON FUNCTION job_lease(text, bigint, bigint) IS
'Leases to p_holder, until now + p_ttl_ms, the next due (dispatch_at <= now), '
'uncancelled, undispatched, unfailed job whose lease is absent or expired, earliest '
'dispatch_at first (ties by run_id), bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline) and adds one to its '
'attempts. Returns it, with the new lease_sequence and attempts, or no row. One UPDATE; rows '
'locked by concurrent leasers are skipped, so an empty answer means nothing '
'leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives.';

CREATE OR REPLACE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_deleted bigint;
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
        RETURNING 1)
    SELECT count(*) INTO v_deleted FROM gone;
    RETURN v_deleted;
END
$$;

COMMENT ON FUNCTION job_purge(bigint, integer) IS
'Deletes at most p_limit finished jobs (dispatched, cancelled or failed) whose finished_at '
'< p_before, oldest first, and returns how many it deleted. Never a waiting job, '
'nor one whose lease is live; rows locked by concurrent calls are skipped (a purge '
'never waits on a lease, a mark or a cancel), so a short answer does not mean '
'nothing is left. Call it until it returns less than p_limit. 22023: p_before NULL '
'or negative, p_limit NULL or not positive. Not granted to the client role: it '
'deletes history.';

COMMENT ON FUNCTION job_cancel(text) IS
'Cancels p_run_id: ''cancelled'' (also when it already was, when it failed, and when '
'a lease is live: its dispatcher learns it from job_mark_dispatched; the first cancel '
'sets finished_at to now unless a failure set it), ''already_dispatched'' '
'(nothing changes: the caller tells the bot to leave), or ''missing''.';

DROP FUNCTION job_schedule(text, bigint);

CREATE FUNCTION job_schedule(
    p_run_id text, p_dispatch_at bigint, p_max_attempts integer DEFAULT NULL
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
$$;

COMMENT ON FUNCTION job_schedule(text, bigint, integer) IS
'Adds the job p_run_id, due at p_dispatch_at, with at most p_max_attempts leases '
'(NULL: store_settings.default_max_attempts, 25 unless the owner changed it). For an '
'existing job moves only dispatch_at, and max_attempts when p_max_attempts is given: '
'lease, attempts, worker_id, dispatched, cancelled and failed are preserved. At commit, '
'notifies job_channel() with dispatch_at as the payload. 22023: p_max_attempts not '
'positive.';

REVOKE ALL ON FUNCTION job_schedule(text, bigint, integer) FROM PUBLIC;

DROP FUNCTION job_release(text, text, bigint, bigint);

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
'22023: p_error longer than 4096 characters.';

REVOKE ALL ON FUNCTION job_release(text, text, bigint, bigint, text) FROM PUBLIC;

CREATE FUNCTION job_retry(p_run_id text, p_dispatch_at bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    v_at := coalesce(p_dispatch_at, now_ms());

    UPDATE jobs j
       SET failed = false,
           attempts = 0,
           dispatch_at = v_at,
           finished_at = NULL
     WHERE j.run_id = p_run_id
       AND j.failed
       AND NOT j.cancelled
       AND NOT j.dispatched;
    IF FOUND THEN
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

REVOKE ALL ON FUNCTION job_retry(text, bigint) FROM PUBLIC;

DROP FUNCTION store_stats(bigint);

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
LANGUAGE plpgsql STABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- The waiting jobs' WHERE is the partial index's predicate, so that part and
    -- the oldest due job read only the jobs still waiting (the same walk
    -- job_lease makes); the history counts scan the table. A schedule is due
    -- and unclaimed from the later of next_run_at and an expired lease's end.
    RETURN QUERY
    SELECT v_now,
           s.total, s.due, s.leased, s.done, os.id, os.since,
           w.pending, w.due, w.due_expired, w.leased,
           h.dispatched, h.recalled, h.cancelled, h.failed,
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
           (SELECT count(*) FILTER (WHERE j.dispatched) AS dispatched,
                   count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                   count(*) FILTER (WHERE j.cancelled AND NOT j.dispatched) AS cancelled,
                   count(*) FILTER (WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched)
                     AS failed
              FROM jobs j
             WHERE j.dispatched OR j.cancelled OR j.failed) AS h
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
'The waiting counts read the pending index; the history counts and the schedules scan '
'their tables (about 0.1 s a million rows).';

REVOKE ALL ON FUNCTION store_stats(bigint) FROM PUBLIC;

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
    attempts     integer,
    max_attempts integer,
    last_error   text,
    failed       boolean,
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
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
           AND j.dispatch_at <= v_now
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'dispatched' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSIF p_filter = 'failed' THEN
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         WHERE j.failed AND NOT j.cancelled AND NOT j.dispatched
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.attempts, j.max_attempts,
               j.last_error, j.failed, count(*) OVER ()
          FROM jobs j
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$$;

COMMENT ON FUNCTION job_list(text, bigint, integer) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects, each row carrying how many match in all (matching). p_filter: ''all''; '
'''due'' (waiting and due at p_now, NULL meaning now_ms(), leased or not); '
'''dispatched''; ''failed'' (out of attempts and not cancelled: what job_retry takes '
'back). The operator''s view of the table (pgstore jobs); 22023 for another '
'filter or a p_limit that is not positive.';

REVOKE ALL ON FUNCTION job_list(text, bigint, integer) FROM PUBLIC;
