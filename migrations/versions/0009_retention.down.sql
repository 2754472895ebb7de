-- pgstore 0009, downgrade: back to pgstore_0008. The jobs stay (finished_at
-- goes); job_mark_dispatched and job_cancel are as in 0008 again.

DROP FUNCTION job_purge(bigint, integer);

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
           worker_id = p_worker_id
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
'cancelled says whether a cancel arrived (tell the bot to leave at once). '
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
        UPDATE jobs SET cancelled = true WHERE run_id = p_run_id;
    END IF;
    RETURN 'cancelled';
END
$$;

COMMENT ON FUNCTION job_cancel(text) IS
'Cancels p_run_id: ''cancelled'' (also when it already was, and when a lease is '
'live: its dispatcher learns it from job_mark_dispatched), ''already_dispatched'' '
'(nothing changes: the caller tells the bot to leave), or ''missing''.';


DROP INDEX jobs_finished_by_finished_at;
ALTER TABLE jobs DROP COLUMN finished_at;

COMMENT ON TABLE jobs IS
'Delayed dispatch with holder leases ("send a bot into meeting R at 10:00"). '
'Written only through the job_* functions; dispatched and cancelled jobs are kept.';

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0008'::text $$;
