-- pgstore 0029, upgrade: written by make revision from sql/; 0029_long_queue_slots.py says what and why.

CREATE OR REPLACE FUNCTION queue_set_concurrency(p_queue text, p_limit integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old  integer;
    v_rate integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    PERFORM check_queue_limit('limit', p_limit);

    -- The queue's row, locked: two calls for one queue take turns.
    SELECT q.concurrency_limit, q.rate_limit INTO v_old, v_rate
      FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL OR v_old IS NOT DISTINCT FROM p_limit THEN
        RETURN false;
    END IF;
    -- A name of at most 1024 characters can still exceed the btree's limit on
    -- index entries (incompressible multibyte characters): bad input, not a crash.
    -- queue_slots' key, (queue, slot), is a few bytes wider than queues': a name
    -- that fits the one may not fit the other, so both writes are in the block.
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, concurrency_limit)
        VALUES (p_queue, now_ms(), p_limit)
        ON CONFLICT (queue) DO UPDATE
            SET concurrency_limit = excluded.concurrency_limit,
                updated_at = excluded.updated_at;

        -- No limit: the concurrency places go, busy or not (a renew then needs
        -- none). Lowered: the places above it are never taken again; those whose
        -- lease may live serve it to its end (its renews keep them) and go at a
        -- later change once that lease shows it ended.
        PERFORM queue_slots_layout(p_queue, p_limit, v_rate);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;
    -- Idle dispatchers wake: a raised (or removed) limit may free due jobs.
    PERFORM pg_notify(job_channel(), now_ms()::text);
    RETURN true;
END
$$;

CREATE OR REPLACE FUNCTION queue_set_rate(p_queue text, p_limit integer, p_period_ms bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old_limit  integer;
    v_old_period bigint;
    v_conc       integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    PERFORM check_queue_limit('limit', p_limit);
    IF (p_limit IS NULL) <> (p_period_ms IS NULL)
       OR p_period_ms < 1 OR p_period_ms > 31622400000 THEN
        PERFORM raise_invalid(
            'period_ms must be NULL exactly when limit is, else from 1 to 31622400000 '
            '(366 days)');
    END IF;

    SELECT q.rate_limit, q.rate_period_ms, q.concurrency_limit
      INTO v_old_limit, v_old_period, v_conc
      FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL
       OR (v_old_limit, v_old_period) IS NOT DISTINCT FROM (p_limit, p_period_ms) THEN
        RETURN false;
    END IF;
    -- As in queue_set_concurrency: queue_slots' key is wider than queues'.
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, rate_limit, rate_period_ms)
        VALUES (p_queue, now_ms(), p_limit, p_period_ms)
        ON CONFLICT (queue) DO UPDATE
            SET rate_limit = excluded.rate_limit,
                rate_period_ms = excluded.rate_period_ms,
                updated_at = excluded.updated_at;

        -- The places up to the new limit keep their taken_at: a lease taken
        -- before a change still counts in the windows it falls in, measured with
        -- the new period.
        PERFORM queue_slots_layout(p_queue, v_conc, p_limit);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;
    PERFORM pg_notify(job_channel(), now_ms()::text);
    RETURN true;
END
$$;

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
