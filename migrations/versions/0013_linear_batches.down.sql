-- pgstore 0013, downgrade: back to pgstore_0012's bodies of job_lease_many,
-- job_mark_dispatched_many and job_renew_many (same signatures: owners, grants
-- and comments are kept). No row changes.

CREATE OR REPLACE FUNCTION job_lease_many(
    p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer
) RETURNS SETOF jobs
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
    PERFORM check_positive('limit', p_limit);
    IF p_limit > batch_max() THEN
        PERFORM raise_invalid(format('limit must be at most %s', batch_max()));
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- job_lease's walk with LIMIT p_limit: the ARRAY() subquery is an InitPlan
    -- that runs once, walks the pending index in lease order and locks up to
    -- p_limit rows, skipping rows concurrent leasers hold locked; the UPDATE then
    -- reaches them through the primary key (an IN would let the planner hash-join
    -- a scan of the whole table). The answer comes back in lease order.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = p_holder,
               lease_until = v_until,
               lease_sequence = greatest(j.lease_sequence + 1, token_floor()),
               attempts = j.attempts + 1
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
    SELECT l.* FROM leased l ORDER BY l.dispatch_at, l.run_id;
END
$$;

CREATE OR REPLACE FUNCTION job_mark_dispatched_many(
    p_run_ids text[], p_holder text, p_worker_ids text[],
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_name('holder', p_holder);
    PERFORM check_same_length('worker_ids', p_worker_ids, cardinality(p_run_ids));
    IF EXISTS (SELECT FROM unnest(p_worker_ids) AS u(w) WHERE length(w) > 1024) THEN
        PERFORM raise_invalid('worker_ids must hold strings of at most 1024 characters');
    END IF;
    PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));

    -- job_mark_dispatched's UPDATE for every job at once, and its race rule:
    -- under READ COMMITTED a concurrent job_cancel either committed before this
    -- UPDATE took the row lock (the re-checked row then says cancelled) or
    -- waits for it and then sees the job dispatched. The jobs the UPDATE does
    -- not record are read as they stood when the statement began, each through
    -- the primary key. The UPDATE reaches the given ids through the primary
    -- key (= ANY; a join alone would let the planner scan the whole table).
    RETURN QUERY
    WITH input AS (
        SELECT u.run_id, u.worker_id, u.lease_sequence, u.ord
          FROM unnest(p_run_ids, p_worker_ids, p_lease_sequences)
               WITH ORDINALITY AS u(run_id, worker_id, lease_sequence, ord)
    ), marked AS (
        UPDATE jobs j
           SET dispatched = true,
               worker_id = i.worker_id,
               finished_at = coalesce(j.finished_at, now_ms())
          FROM input i
         WHERE j.run_id = ANY (p_run_ids)
           AND j.run_id = i.run_id
           AND j.lease_holder = p_holder
           AND (i.lease_sequence IS NULL OR j.lease_sequence = i.lease_sequence)
        RETURNING j.run_id, j.cancelled)
    SELECT i.run_id,
           coalesce(m.cancelled,
                    (SELECT s.cancelled FROM jobs s WHERE s.run_id = i.run_id),
                    false),
           m.run_id IS NOT NULL
      FROM input i
      LEFT JOIN marked m ON m.run_id = i.run_id
     ORDER BY i.ord;
END
$$;

CREATE OR REPLACE FUNCTION job_renew_many(
    p_run_ids text[], p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, renewed boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    RETURN QUERY
    WITH input AS (
        SELECT u.run_id, u.lease_sequence, u.ord
          FROM unnest(p_run_ids, p_lease_sequences)
               WITH ORDINALITY AS u(run_id, lease_sequence, ord)
    ), renewed AS (
        UPDATE jobs j
           SET lease_until = v_until
          FROM input i
         WHERE j.run_id = ANY (p_run_ids)  -- through the primary key
           AND j.run_id = i.run_id
           AND j.lease_holder = p_holder
           AND j.lease_until > v_now
           AND (i.lease_sequence IS NULL OR j.lease_sequence = i.lease_sequence)
        RETURNING j.run_id)
    SELECT i.run_id, r.run_id IS NOT NULL
      FROM input i
      LEFT JOIN renewed r ON r.run_id = i.run_id
     ORDER BY i.ord;
END
$$;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0012'::text $$;
