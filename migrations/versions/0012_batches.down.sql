-- pgstore 0012, downgrade: back to pgstore_0011. The batch calls go; no row changes.

DROP FUNCTION job_renew_many(text[], text, bigint, bigint, bigint[]);
DROP FUNCTION job_mark_dispatched_many(text[], text, text[], bigint[]);
DROP FUNCTION job_lease_many(text, bigint, bigint, integer);
DROP FUNCTION job_schedule_many(text[], bigint[]);
DROP FUNCTION check_lease_sequences(bigint[], integer);
DROP FUNCTION check_same_length(text, anyarray, integer);
DROP FUNCTION check_run_ids(text[]);
DROP FUNCTION batch_max();

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0011'::text $$;
