-- pgstore 0005, downgrade: the schedule_register of 0004 (and 0003).

CREATE OR REPLACE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL
) RETURNS schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint := coalesce(p_now, now_ms());
    v_row schedules;
BEGIN
    PERFORM check_name('id', p_id);
    PERFORM check_one_of('kind', p_kind, ARRAY['cron', 'interval', 'once']);
    PERFORM check_present('spec', p_spec);

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO schedules AS s (id, kind, spec, next_run_at, fencing_token, updated_at)
        VALUES (p_id, p_kind, p_spec, p_next_run_at,
                coalesce((SELECT f.fencing_token FROM schedule_fences f WHERE f.id = p_id), 0),
                v_now)
        ON CONFLICT (id) DO UPDATE
            SET kind = excluded.kind,
                spec = excluded.spec,
                next_run_at = excluded.next_run_at,
                updated_at = excluded.updated_at
            WHERE (s.kind, s.spec) IS DISTINCT FROM (excluded.kind, excluded.spec);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'id is too long to index: at most about 2700 bytes of UTF-8';
    END;
    -- ON CONFLICT locks the existing row even when it is left untouched.

    -- A schedule_delete that committed while the INSERT waited on its row
    -- lock wrote a fence that the INSERT's snapshot could not see. This
    -- statement takes a new snapshot and lifts the token to that fence, so a
    -- token never goes backwards, whatever the interleaving.
    UPDATE schedules s
       SET fencing_token = f.fencing_token
      FROM schedule_fences f
     WHERE s.id = p_id AND f.id = p_id AND f.fencing_token > s.fencing_token;

    SELECT * INTO STRICT v_row FROM schedules WHERE id = p_id;
    RETURN v_row;
END
$$;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0004'::text $$;
