-- pgstore 0011, downgrade: back to pgstore_0010. The schedules stay (catch_up
-- goes); a last_status of skipped becomes NULL (0010 knows only ok and error, and
-- the occurrence did not run); schedule_register and schedule_complete are as in
-- 0010 again.

DROP FUNCTION schedule_register(text, text, text, bigint, bigint, text);

CREATE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL
) RETURNS schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now bigint;
    v_row schedules;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_one_of('kind', p_kind, ARRAY['cron', 'interval', 'once']);
    PERFORM check_present('spec', p_spec);
    PERFORM check_length('spec', p_spec);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO schedules AS s (id, kind, spec, next_run_at, fencing_token, updated_at)
        VALUES (p_id, p_kind, p_spec, p_next_run_at,
                greatest(coalesce((SELECT f.fencing_token FROM schedule_fences f
                                    WHERE f.id = p_id), 0),
                         token_floor()),
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

    -- Under REPEATABLE READ or SERIALIZABLE, a delete that committed after
    -- this transaction's snapshot leaves the deleted row visible beside the
    -- new one and its fence invisible, so the INSERT may have started from an
    -- older fence (a token going backwards): a serialization failure, which
    -- the caller retries. Under READ COMMITTED only the live row is visible.
    IF (SELECT count(*) FROM schedules WHERE id = p_id) > 1 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'serialization_failure',
            MESSAGE = 'could not serialize access due to a concurrent schedule_delete',
            HINT = 'Retry the transaction.';
    END IF;

    SELECT * INTO STRICT v_row FROM schedules WHERE id = p_id;
    RETURN v_row;
END
$$;

COMMENT ON FUNCTION schedule_register(text, text, text, bigint, bigint) IS
'Absent: insert with fencing_token = the id''s high-water mark (or 0, and at '
'least token_floor()) and '
'updated_at = now. Present with the same kind and spec: untouched (a restart '
'keeps its next_run_at). Present with another kind or spec: overwrite kind, '
'spec and next_run_at, updated_at = now; token, lease and last_* kept. '
'Returns the stored row. p_next_run_at may be NULL (a tombstone). p_spec: at '
'most 1024 characters.';

REVOKE ALL ON FUNCTION schedule_register(text, text, text, bigint, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION schedule_complete(
    p_id text, p_fencing_token bigint, p_next_run_at bigint,
    p_last_run_at bigint, p_last_status text, p_now bigint DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now       bigint;
    v_completed boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_present('fencing_token', p_fencing_token);
    PERFORM check_present('last_run_at', p_last_run_at);
    PERFORM check_one_of('last_status', p_last_status, ARRAY['ok', 'error']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    UPDATE schedules s
       SET next_run_at = p_next_run_at,
           last_run_at = p_last_run_at,
           last_status = p_last_status,
           consecutive_failures = CASE WHEN p_last_status = 'ok' THEN 0
                                       ELSE least(s.consecutive_failures, 2147483646) + 1 END,
           lease_owner = NULL,
           lease_until = NULL,
           updated_at = v_now
     WHERE id = p_id
       AND fencing_token = p_fencing_token
       AND lease_owner IS NOT NULL
    RETURNING true INTO v_completed;
    RETURN coalesce(v_completed, false);
END
$$;

COMMENT ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) IS
'Commits an occurrence only if p_fencing_token matches and the claim is still '
'held: writes next_run_at (NULL = tombstone), last_run_at and last_status, '
'adds one to consecutive_failures for ''error'' (reset to 0 for ''ok''), '
'clears the lease, updated_at = now. False when stale (claimed again since), '
'already completed, re-registered or deleted; then nothing changes.';

UPDATE schedules SET last_status = NULL WHERE last_status = 'skipped';

ALTER TABLE schedules DROP CONSTRAINT schedules_last_status_check;
ALTER TABLE schedules
    ADD CONSTRAINT schedules_last_status_check CHECK (last_status IN ('ok', 'error'));
COMMENT ON COLUMN schedules.last_status IS NULL;

ALTER TABLE schedules DROP COLUMN catch_up;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0010'::text $$;
