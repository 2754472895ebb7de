-- pgstore 0023, upgrade: written by make revision from sql/; 0023_job_list_queues.py says what and why.

DROP FUNCTION job_list(text, bigint, integer);

CREATE FUNCTION job_list(
    p_filter text, p_now bigint, p_limit integer, p_queues text[] DEFAULT NULL
)
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
    PERFORM check_queues(p_queues);
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
                   AND (p_queues IS NULL OR d.queue = ANY (p_queues))
                UNION ALL
                SELECT q.*
                  FROM jobs q
                 WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                   AND (q.queue <> 'default' OR q.priority <> 0)
                   AND q.dispatch_at <= v_now
                   AND (p_queues IS NULL OR q.queue = ANY (p_queues))) AS j
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
           AND (p_queues IS NULL OR j.queue = ANY (p_queues))
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
           AND (p_queues IS NULL OR j.queue = ANY (p_queues))
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    ELSE
        RETURN QUERY
        SELECT j.run_id, j.dispatch_at, j.lease_holder, j.lease_until, j.worker_id,
               j.dispatched, j.cancelled, j.lease_sequence, j.finished_at, j.attempts,
               j.max_attempts, j.last_error, j.failed, j.queue, j.priority, j.payload,
               count(*) OVER ()
          FROM jobs j
         WHERE p_queues IS NULL OR j.queue = ANY (p_queues)
         ORDER BY j.dispatch_at, j.run_id
         LIMIT p_limit;
    END IF;
END
$$;

COMMENT ON FUNCTION job_list(text, bigint, integer, text[]) IS
'Jobs by dispatch_at, then run_id: the first p_limit (NULL: all) of those p_filter '
'selects in the queues p_queues (NULL, the default: every queue), with the columns of the jobs table in its order, each row then carrying how '
'many match in all (matching). p_filter: ''all''; '
'''due'' (waiting and due at p_now, NULL meaning now_ms(), leased or not); '
'''dispatched''; ''failed'' (out of attempts and not cancelled: what job_retry takes '
'back). The operator''s view of the table (pgstore jobs); 22023 for another '
'filter, a p_limit that is not positive, or p_queues not NULL nor a non-empty array of '
'queue names.';

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
