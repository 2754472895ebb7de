-- pgstore: shared helpers.
--
-- Every file in sql/ is loaded with search_path set to "<schema>, pg_temp",
-- and every function pins that path with SET search_path FROM CURRENT, so
-- no schema name appears in any body: the schema is chosen at migration time.

CREATE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0003'::text $$;

COMMENT ON FUNCTION schema_revision() IS
'The migration revision this schema''s objects were built by. The Python '
'stores compare it with their migration head at start().';

CREATE FUNCTION now_ms() RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

COMMENT ON FUNCTION now_ms() IS
'The database clock (clock_timestamp()) in epoch milliseconds. Every p_now '
'argument that is NULL means this value, so callers on many hosts share one clock.';

CREATE FUNCTION check_name(p_param text, p_value text) RETURNS void
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

COMMENT ON FUNCTION check_name(text, text) IS
'Raises 22023 naming p_param unless p_value is a non-empty string of at most '
'1024 characters (ids, owners, holders, worker ids).';

CREATE FUNCTION check_positive(p_param text, p_value bigint) RETURNS void
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

COMMENT ON FUNCTION check_positive(text, bigint) IS
'Raises 22023 naming p_param unless p_value is a positive integer '
'(lease_ms, ttl_ms, limit).';

CREATE FUNCTION check_present(p_param text, p_value anyelement) RETURNS void
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

COMMENT ON FUNCTION check_present(text, anyelement) IS
'Raises 22023 naming p_param when p_value is NULL.';

CREATE FUNCTION check_one_of(p_param text, p_value text, p_allowed text[]) RETURNS void
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

COMMENT ON FUNCTION check_one_of(text, text, text[]) IS
'Raises 22023 naming p_param unless p_value is one of p_allowed (kind, last_status).';
