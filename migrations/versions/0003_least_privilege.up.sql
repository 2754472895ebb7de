-- pgstore 0003, upgrade: least privilege. The functions run as their owner;
-- nobody else may execute them or touch the tables, except through the
-- client role's grants (0003_client_role.sql.template). And ids too long for
-- the primary key's btree are rejected as bad input (22023), not 54000.

ALTER FUNCTION now_ms() SECURITY DEFINER;
ALTER FUNCTION schedule_get(text) SECURITY DEFINER;
ALTER FUNCTION schedule_register(text, text, text, bigint, bigint) SECURITY DEFINER;
ALTER FUNCTION schedule_claim_due(text, text, bigint, bigint) SECURITY DEFINER;
ALTER FUNCTION schedule_renew(text, bigint, bigint) SECURITY DEFINER;
ALTER FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) SECURITY DEFINER;
ALTER FUNCTION schedule_delete(text) SECURITY DEFINER;
ALTER FUNCTION schedule_list() SECURITY DEFINER;
ALTER FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) SECURITY DEFINER;
ALTER FUNCTION job_channel() SECURITY DEFINER;
ALTER FUNCTION job_schedule(text, bigint) SECURITY DEFINER;
ALTER FUNCTION job_lease(text, bigint, bigint) SECURITY DEFINER;
ALTER FUNCTION job_renew(text, text, bigint, bigint) SECURITY DEFINER;
ALTER FUNCTION job_mark_dispatched(text, text, text) SECURITY DEFINER;
ALTER FUNCTION job_release(text, text, bigint) SECURITY DEFINER;
ALTER FUNCTION job_cancel(text) SECURITY DEFINER;
ALTER FUNCTION job_get(text) SECURITY DEFINER;
ALTER FUNCTION job_list_dispatched() SECURITY DEFINER;
ALTER FUNCTION job_remove(text) SECURITY DEFINER;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0003'::text $$;

-- pgstore: who may do what.
--
-- The store's functions run as their owner (SECURITY DEFINER, declared on
-- each function) with search_path pinned to "<schema>, pg_temp", so a caller's
-- own schemas and temporary objects can never stand in for the store's. No
-- one but the owner may execute anything or touch the tables directly: the
-- migration grants EXECUTE on the API functions (not the check_* helpers) and
-- USAGE on the schema to the client role "<schema>_client" (see
-- client_role.sql.template); the tables grant nothing to clients.
--
-- Run migrations as a dedicated owner role, not a superuser: the functions
-- run with the owner's rights.

REVOKE ALL ON FUNCTION schema_revision() FROM PUBLIC;
REVOKE ALL ON FUNCTION now_ms() FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_get(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_register(text, text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_claim_due(text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_renew(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_delete(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_list() FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_channel() FROM PUBLIC;
REVOKE ALL ON FUNCTION job_schedule(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_lease(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_renew(text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_mark_dispatched(text, text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_release(text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_cancel(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_get(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_list_dispatched() FROM PUBLIC;
REVOKE ALL ON FUNCTION job_remove(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_name(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_positive(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_present(text, anyelement) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_one_of(text, text, text[]) FROM PUBLIC;

REVOKE ALL ON TABLE schedules, schedule_fences, jobs FROM PUBLIC;

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

CREATE OR REPLACE FUNCTION job_schedule(p_run_id text, p_dispatch_at bigint) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_present('dispatch_at', p_dispatch_at);

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO jobs AS j (run_id, dispatch_at)
        VALUES (p_run_id, p_dispatch_at)
        ON CONFLICT (run_id) DO UPDATE
            SET dispatch_at = excluded.dispatch_at;
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'run_id is too long to index: at most about 2700 bytes of UTF-8';
    END;

    -- Delivered at commit. Only scheduling notifies: a NOTIFY on the lease,
    -- renew or dispatch path would serialise every commit in the database.
    PERFORM pg_notify(job_channel(), p_dispatch_at::text);
END
$$;
