-- pgstore 0017, upgrade: written by make revision from sql/; 0017_job_reschedule.py says what and why.

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

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
