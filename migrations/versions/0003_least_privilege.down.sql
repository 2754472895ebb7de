-- pgstore 0003, downgrade: back to the default privileges and the bodies of 0002.

CREATE OR REPLACE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL
) RETURNS schedules
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint := coalesce(p_now, now_ms());
    v_row schedules;
BEGIN
    PERFORM check_name('id', p_id);
    PERFORM check_one_of('kind', p_kind, ARRAY['cron', 'interval', 'once']);
    PERFORM check_present('spec', p_spec);

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
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_present('dispatch_at', p_dispatch_at);

    INSERT INTO jobs AS j (run_id, dispatch_at)
    VALUES (p_run_id, p_dispatch_at)
    ON CONFLICT (run_id) DO UPDATE
        SET dispatch_at = excluded.dispatch_at;

    -- Delivered at commit. Only scheduling notifies: a NOTIFY on the lease,
    -- renew or dispatch path would serialise every commit in the database.
    PERFORM pg_notify(job_channel(), p_dispatch_at::text);
END
$$;

GRANT EXECUTE ON FUNCTION schema_revision() TO PUBLIC;
GRANT EXECUTE ON FUNCTION now_ms() TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_get(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_register(text, text, text, bigint, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_claim_due(text, text, bigint, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_renew(text, bigint, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_delete(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_list() TO PUBLIC;
GRANT EXECUTE ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_channel() TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_schedule(text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_lease(text, bigint, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_renew(text, text, bigint, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_mark_dispatched(text, text, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_release(text, text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_cancel(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_get(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_list_dispatched() TO PUBLIC;
GRANT EXECUTE ON FUNCTION job_remove(text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION check_name(text, text) TO PUBLIC;
GRANT EXECUTE ON FUNCTION check_positive(text, bigint) TO PUBLIC;
GRANT EXECUTE ON FUNCTION check_present(text, anyelement) TO PUBLIC;
GRANT EXECUTE ON FUNCTION check_one_of(text, text, text[]) TO PUBLIC;

ALTER FUNCTION now_ms() SECURITY INVOKER;
ALTER FUNCTION schedule_get(text) SECURITY INVOKER;
ALTER FUNCTION schedule_register(text, text, text, bigint, bigint) SECURITY INVOKER;
ALTER FUNCTION schedule_claim_due(text, text, bigint, bigint) SECURITY INVOKER;
ALTER FUNCTION schedule_renew(text, bigint, bigint) SECURITY INVOKER;
ALTER FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) SECURITY INVOKER;
ALTER FUNCTION schedule_delete(text) SECURITY INVOKER;
ALTER FUNCTION schedule_list() SECURITY INVOKER;
ALTER FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) SECURITY INVOKER;
ALTER FUNCTION job_channel() SECURITY INVOKER;
ALTER FUNCTION job_schedule(text, bigint) SECURITY INVOKER;
ALTER FUNCTION job_lease(text, bigint, bigint) SECURITY INVOKER;
ALTER FUNCTION job_renew(text, text, bigint, bigint) SECURITY INVOKER;
ALTER FUNCTION job_mark_dispatched(text, text, text) SECURITY INVOKER;
ALTER FUNCTION job_release(text, text, bigint) SECURITY INVOKER;
ALTER FUNCTION job_cancel(text) SECURITY INVOKER;
ALTER FUNCTION job_get(text) SECURITY INVOKER;
ALTER FUNCTION job_list_dispatched() SECURITY INVOKER;
ALTER FUNCTION job_remove(text) SECURITY INVOKER;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0002'::text $$;
