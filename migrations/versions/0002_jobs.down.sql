-- pgstore 0002, downgrade: remove the job store.
DROP FUNCTION job_remove(text);
DROP FUNCTION job_list_dispatched();
DROP FUNCTION job_get(text);
DROP FUNCTION job_cancel(text);
DROP FUNCTION job_release(text, text, bigint);
DROP FUNCTION job_mark_dispatched(text, text, text);
DROP FUNCTION job_renew(text, text, bigint, bigint);
DROP FUNCTION job_lease(text, bigint, bigint);
DROP FUNCTION job_schedule(text, bigint);
DROP FUNCTION job_channel();
DROP TABLE jobs;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0001'::text $$;
