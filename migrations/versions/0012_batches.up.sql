-- pgstore 0012, upgrade: the job store's batch calls.
--
-- * job_schedule_many, job_lease_many, job_mark_dispatched_many and
--   job_renew_many: one statement over up to batch_max() jobs each, with the
--   per-job meaning of the single-job functions (which stay as they are).
--   Granted to the client role (the revision's list). No table changes.
-- * Their checks: batch_max(), check_run_ids(), check_same_length().

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

CREATE FUNCTION job_schedule_many(p_run_ids text[], p_dispatch_at bigint[]) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
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
$$;

COMMENT ON FUNCTION job_schedule_many(text[], bigint[]) IS
'job_schedule (without p_max_attempts) for each (p_run_ids[i], p_dispatch_at[i]), '
'in one INSERT: adds the jobs with store_settings.default_max_attempts, and for '
'existing ones moves only dispatch_at. At commit, notifies '
'job_channel() once, with the earliest dispatch_at as the payload (nothing for '
'empty arrays). 22023 and nothing changes: run_ids NULL, longer than batch_max(), '
'with a NULL, empty, too long or repeated id; dispatch_at NULL, not as long, or '
'holding a NULL.';

CREATE FUNCTION job_lease_many(
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

COMMENT ON FUNCTION job_lease_many(text, bigint, bigint, integer) IS
'job_lease for up to p_limit jobs at once: leases to p_holder, until now + p_ttl_ms, '
'the next due, uncancelled, undispatched, unfailed jobs whose lease is absent or '
'expired, in lease order (dispatch_at, then run_id), bumping each one''s '
'lease_sequence and adding one to its attempts as job_lease does. Returns them in that order: fewer than p_limit (none) when no more '
'are leasable right now; rows locked by concurrent leasers are skipped. One UPDATE. '
'22023: p_limit NULL, not positive or above batch_max(), and job_lease''s rules.';

CREATE FUNCTION job_mark_dispatched_many(
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

COMMENT ON FUNCTION job_renew_many(text[], text, bigint, bigint, bigint[]) IS
'job_renew for each p_run_ids[i] by p_holder, fenced by p_lease_sequences[i] when '
'that array and that element are not NULL: one row (run_id, renewed) per job, in the '
'order given; renewed = false means that lease was lost and its holder must stop. '
'One UPDATE. 22023 and nothing changes: run_ids as job_schedule_many says, '
'lease_sequences not as long or with an element that is not positive, and '
'job_renew''s rules for p_holder, p_now and p_ttl_ms.';

REVOKE ALL ON FUNCTION job_schedule_many(text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_lease_many(text, bigint, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_mark_dispatched_many(text[], text, text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_renew_many(text[], text, bigint, bigint, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION batch_max() FROM PUBLIC;
REVOKE ALL ON FUNCTION check_run_ids(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_same_length(text, anyarray, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_lease_sequences(bigint[], integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0012'::text $$;
