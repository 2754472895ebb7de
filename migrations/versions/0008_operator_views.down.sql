-- pgstore 0008, downgrade: back to pgstore_0007.

DROP FUNCTION job_list(text, bigint, integer);
DROP FUNCTION store_stats(bigint);

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0007'::text $$;
