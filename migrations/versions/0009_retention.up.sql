-- pgstore 0009, upgrade: retention for jobs.
--
-- * jobs.finished_at: when a job finished (dispatched, or cancelled before its
--   dispatch), set by job_mark_dispatched and job_cancel from now on. The jobs
--   already finished get the time of this upgrade: the store never recorded
--   when they finished, and a guess from dispatch_at could let a purge delete
--   history sooner than its retention promises.
-- * An index of the finished jobs by finished_at, and job_purge(p_before,
--   p_limit), which deletes them in batches. job_purge is granted to no one:
--   it deletes history, so only the owner (or a role the DBA grants) runs it.
-- * job_mark_dispatched and job_cancel keep their signatures: CREATE OR
--   REPLACE, which keeps owners and grants.

ALTER TABLE jobs ADD COLUMN finished_at bigint;

UPDATE jobs SET finished_at = now_ms() WHERE dispatched OR cancelled;

CREATE INDEX jobs_finished_by_finished_at ON jobs (finished_at, run_id)
    WHERE finished_at IS NOT NULL;

COMMENT ON TABLE jobs IS
'Delayed dispatch with holder leases ("send a bot into meeting R at 10:00"). '
'Written only through the job_* functions; dispatched and cancelled jobs are kept '
'until job_purge deletes them.';
COMMENT ON COLUMN jobs.finished_at IS
'Epoch ms (the database clock) when the job finished: set by job_mark_dispatched '
'and by job_cancel of an undispatched job, once; NULL while the job waits. '
'Jobs finished before pgstore_0009 got the time of that upgrade.';
COMMENT ON INDEX jobs_finished_by_finished_at IS
'The purge path: finished jobs only, oldest finished_at first.';

CREATE OR REPLACE FUNCTION job_mark_dispatched(
    p_run_id text, p_holder text, p_worker_id text, p_lease_sequence bigint DEFAULT NULL
) RETURNS TABLE (cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_cancelled boolean;
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
    -- or waits for it and then sees the job dispatched.
    UPDATE jobs j
       SET dispatched = true,
           worker_id = p_worker_id,
           finished_at = coalesce(j.finished_at, now_ms())
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
    RETURNING j.cancelled INTO v_cancelled;
    IF FOUND THEN
        RETURN QUERY SELECT v_cancelled, true;
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


CREATE OR REPLACE FUNCTION job_cancel(p_run_id text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_dispatched boolean;
    v_cancelled  boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- The row lock orders this call against a concurrent job_mark_dispatched:
    -- it waits for that commit and then reads the dispatched row.
    SELECT j.dispatched, j.cancelled INTO v_dispatched, v_cancelled
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
    END IF;
    RETURN 'cancelled';
END
$$;

COMMENT ON FUNCTION job_cancel(text) IS
'Cancels p_run_id: ''cancelled'' (also when it already was, and when a lease is '
'live: its dispatcher learns it from job_mark_dispatched; the first cancel sets '
'finished_at to now), ''already_dispatched'' '
'(nothing changes: the caller tells the bot to leave), or ''missing''.';


CREATE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
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
                      AND (c.dispatched OR c.cancelled)
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
'Deletes at most p_limit finished jobs (dispatched, or cancelled) whose finished_at '
'< p_before, oldest first, and returns how many it deleted. Never a waiting job, '
'nor one whose lease is live; rows locked by concurrent calls are skipped (a purge '
'never waits on a lease, a mark or a cancel), so a short answer does not mean '
'nothing is left. Call it until it returns less than p_limit. 22023: p_before NULL '
'or negative, p_limit NULL or not positive. Not granted to the client role: it '
'deletes history.';

REVOKE ALL ON FUNCTION job_purge(bigint, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0009'::text $$;
