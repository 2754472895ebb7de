-- pgstore 0011, upgrade: a catch-up policy per schedule.
--
-- * schedules.catch_up: skip, once or all (NOT NULL, default once: what every
--   schedule did before this revision, so existing rows keep their behaviour).
-- * last_status may be skipped: an occurrence missed under catch_up = skip is
--   completed without being run. It leaves consecutive_failures as it was.
-- * schedule_register takes p_catch_up (default once, so calls without it work
--   as before): a new signature, dropped and created again; the revision grants
--   it to whoever could execute the old one. schedule_complete accepts
--   last_status skipped: same signature, CREATE OR REPLACE.

ALTER TABLE schedules
    ADD COLUMN catch_up text NOT NULL DEFAULT 'once' CHECK (catch_up IN ('skip', 'once', 'all'));

ALTER TABLE schedules DROP CONSTRAINT schedules_last_status_check;
ALTER TABLE schedules
    ADD CONSTRAINT schedules_last_status_check
    CHECK (last_status IN ('ok', 'error', 'skipped'));

COMMENT ON COLUMN schedules.last_status IS
'Outcome of the last occurrence: ok, error (the handler raised) or skipped (not run: '
'missed under catch_up = skip).';
COMMENT ON COLUMN schedules.catch_up IS
'What the scheduler does with occurrences missed while none ran: skip (none is run), '
'once (one run, then the future) or all (each, in order, up to the scheduler''s cap). '
'Kept by the store; applied by whoever computes next_run_at.';

DROP FUNCTION schedule_register(text, text, text, bigint, bigint);

CREATE FUNCTION schedule_register(
    p_id text, p_kind text, p_spec text, p_next_run_at bigint, p_now bigint DEFAULT NULL,
    p_catch_up text DEFAULT 'once'
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
    PERFORM check_one_of('catch_up', p_catch_up, ARRAY['skip', 'once', 'all']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    -- An id of at most 1024 characters can still exceed the btree's limit on
    -- index entries (about 2700 bytes once compressed: long runs of
    -- incompressible multibyte characters). That is bad input, not a crash.
    BEGIN
        INSERT INTO schedules AS s
               (id, kind, spec, next_run_at, fencing_token, updated_at, catch_up)
        VALUES (p_id, p_kind, p_spec, p_next_run_at,
                greatest(coalesce((SELECT f.fencing_token FROM schedule_fences f
                                    WHERE f.id = p_id), 0),
                         token_floor()),
                v_now, p_catch_up)
        ON CONFLICT (id) DO UPDATE
            SET kind = excluded.kind,
                spec = excluded.spec,
                -- A new policy alone keeps the occurrence: the grid is the same.
                next_run_at = CASE WHEN (s.kind, s.spec)
                                        IS DISTINCT FROM (excluded.kind, excluded.spec)
                                   THEN excluded.next_run_at
                                   ELSE s.next_run_at END,
                catch_up = excluded.catch_up,
                updated_at = excluded.updated_at
            WHERE (s.kind, s.spec, s.catch_up)
                  IS DISTINCT FROM (excluded.kind, excluded.spec, excluded.catch_up);
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

COMMENT ON FUNCTION schedule_register(text, text, text, bigint, bigint, text) IS
'Absent: insert with fencing_token = the id''s high-water mark (or 0, and at '
'least token_floor()), catch_up = p_catch_up and '
'updated_at = now. Present with the same kind, spec and catch_up: untouched (a '
'restart keeps its next_run_at). Present with another kind or spec: overwrite kind, '
'spec, next_run_at and catch_up, updated_at = now; token, lease and last_* kept. '
'Present with the same kind and spec but another catch_up: only catch_up and '
'updated_at change. Returns the stored row. p_next_run_at may be NULL (a '
'tombstone). p_spec: at most 1024 characters. p_catch_up: skip, once (the '
'default) or all; the store keeps it, the caller that computes next_run_at '
'applies it.';

REVOKE ALL ON FUNCTION schedule_register(text, text, text, bigint, bigint, text) FROM PUBLIC;

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
    PERFORM check_one_of('last_status', p_last_status, ARRAY['ok', 'error', 'skipped']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    UPDATE schedules s
       SET next_run_at = p_next_run_at,
           last_run_at = p_last_run_at,
           last_status = p_last_status,
           consecutive_failures = CASE p_last_status
                                      WHEN 'ok' THEN 0
                                      WHEN 'error'
                                      THEN least(s.consecutive_failures, 2147483646) + 1
                                      ELSE s.consecutive_failures END,
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
'held: writes next_run_at (NULL = tombstone), last_run_at and last_status (ok, '
'error, or skipped: the occurrence was not run), '
'adds one to consecutive_failures for ''error'' (reset to 0 for ''ok'', kept for '
'''skipped''), '
'clears the lease, updated_at = now. False when stale (claimed again since), '
'already completed, re-registered or deleted; then nothing changes.';

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0011'::text $$;
