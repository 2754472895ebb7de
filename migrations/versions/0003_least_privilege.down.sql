-- pgstore 0003, downgrade: back to the default privileges of 0002.

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
