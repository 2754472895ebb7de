-- pgstore 0004, downgrade: the helpers and the schedule_claim_next of 0003.

CREATE OR REPLACE FUNCTION now_ms() RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

CREATE OR REPLACE FUNCTION check_name(p_param text, p_value text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL OR p_value = '' OR length(p_value) > 1024 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s must be a non-empty string of at most 1024 characters', p_param);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION check_positive(p_param text, p_value bigint) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL OR p_value <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s must be a positive integer', p_param);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION check_present(p_param text, p_value anyelement) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s must not be null', p_param);
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION check_one_of(p_param text, p_value text, p_allowed text[]) RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path FROM CURRENT
AS $$
BEGIN
    IF p_value IS NULL OR NOT p_value = ANY (p_allowed) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = format('%s must be one of %s', p_param, array_to_string(p_allowed, ', '));
    END IF;
END
$$;

DROP FUNCTION raise_invalid(text);

CREATE OR REPLACE FUNCTION schedule_claim_next(
    p_owner text, p_now bigint, p_lease_ms bigint, p_limit integer, p_ids text[] DEFAULT NULL
) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    PERFORM check_positive('limit', p_limit);
    IF EXISTS (SELECT FROM unnest(p_ids) AS i(id)
                WHERE i.id IS NULL OR i.id = '' OR length(i.id) > 1024) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'ids must hold non-empty strings of at most 1024 characters';
    END IF;
    v_now := coalesce(p_now, now_ms());
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps

    -- ARRAY(subquery) is an InitPlan: the candidates are locked and collected
    -- once, so no plan can re-scan them and claim more than p_limit rows.
    RETURN QUERY
    WITH claimed AS (
        UPDATE schedules s
           SET lease_owner = p_owner,
               lease_until = v_until,
               fencing_token = s.fencing_token + 1
         WHERE s.id = ANY (ARRAY(
                   SELECT c.id
                     FROM schedules c
                    WHERE c.next_run_at IS NOT NULL
                      AND c.next_run_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                      AND (p_ids IS NULL OR c.id = ANY (p_ids))
                    ORDER BY c.next_run_at, c.id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING s.*
    )
    SELECT * FROM claimed ORDER BY next_run_at, id;
END
$$;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0003'::text $$;
