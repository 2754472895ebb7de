-- pgstore 0006, upgrade: a size limit on a schedule's spec, and an optional
-- bound on how far a client's p_now may be from the database clock.
--
-- * schedule_register rejects a spec longer than 1024 characters (22023
--   naming spec). Rows already stored are left as they are.
-- * store_settings (one row, owner only) holds max_clock_skew_ms, NULL (off)
--   by default. When set, every function taking p_now rejects a p_now that is
--   not NULL and lies further than that from now_ms() (22023 naming now).
--   Not a custom GUC: any session may SET one, so a client could lift the
--   bound for itself.
--
-- CREATE OR REPLACE keeps the owner and the grants; the new helpers and the
-- table grant nothing to the client role.

CREATE FUNCTION check_length(p_param text, p_value text) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN length(p_value) > 1024
                THEN raise_invalid(format(
                         '%s must be a string of at most 1024 characters', p_param))
           END
$$;

COMMENT ON FUNCTION check_length(text, text) IS
'Raises 22023 naming p_param when p_value is longer than 1024 characters; NULL '
'and the empty string pass (check_present rejects NULL). A schedule''s spec.';

CREATE TABLE store_settings (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_clock_skew_ms bigint CHECK (max_clock_skew_ms >= 0)
);

INSERT INTO store_settings DEFAULT VALUES;

COMMENT ON TABLE store_settings IS
'The store''s settings: one row, written by the owner with plain UPDATE. Clients '
'can neither read nor write it.';
COMMENT ON COLUMN store_settings.singleton IS
'Always true: the primary key that keeps the table to one row.';
COMMENT ON COLUMN store_settings.max_clock_skew_ms IS
'NULL (the default): off. Else every p_now that is not NULL must lie within this '
'many ms of now_ms(), or the call raises 22023 naming now and changes nothing.';

CREATE FUNCTION check_now(p_now bigint) RETURNS bigint
LANGUAGE plpgsql
AS $$
-- Like the check_* helpers it runs as its caller, an API function: as the
-- store's owner, on that function's pinned search_path. The callers write
-- "CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END": the
-- database-clock path never reads the table, and as a plpgsql assignment of
-- a plain expression it costs no query of its own beyond the one below.
DECLARE
    v_bound bigint;
    v_clock bigint;
BEGIN
    SELECT s.max_clock_skew_ms INTO v_bound FROM store_settings s;
    IF v_bound IS NOT NULL THEN
        v_clock := now_ms();
        -- numeric: p_now may be anywhere in bigint's range, so p_now - v_clock
        -- could overflow.
        IF abs(p_now::numeric - v_clock) > v_bound THEN
            PERFORM raise_invalid(format(
                'now must be within %s ms of the database clock (now - now_ms() = %s ms)',
                v_bound, p_now::numeric - v_clock));
        END IF;
    END IF;
    RETURN p_now;
END
$$;

COMMENT ON FUNCTION check_now(bigint) IS
'Returns p_now; raises 22023 naming now instead when store_settings.max_clock_skew_ms '
'is set and p_now is further than that from now_ms(). Called only for a p_now that '
'is not NULL.';

CREATE OR REPLACE FUNCTION schedule_register(
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
'Absent: insert with fencing_token = the id''s high-water mark (or 0) and '
'updated_at = now. Present with the same kind and spec: untouched (a restart '
'keeps its next_run_at). Present with another kind or spec: overwrite kind, '
'spec and next_run_at, updated_at = now; token, lease and last_* kept. '
'Returns the stored row. p_next_run_at may be NULL (a tombstone). p_spec: at '
'most 1024 characters.';

CREATE OR REPLACE FUNCTION schedule_claim_due(
    p_id text, p_owner text, p_now bigint, p_lease_ms bigint
) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_name('id', p_id);
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps

    RETURN QUERY
    UPDATE schedules s
       SET lease_owner = p_owner,
           lease_until = v_until,
           fencing_token = s.fencing_token + 1
     WHERE s.id = p_id
       AND s.next_run_at IS NOT NULL
       AND s.next_run_at <= v_now
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$$;

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
    PERFORM check_name('id', p_id);
    PERFORM check_present('fencing_token', p_fencing_token);
    PERFORM check_present('last_run_at', p_last_run_at);
    PERFORM check_one_of('last_status', p_last_status, ARRAY['ok', 'error']);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;

    UPDATE schedules
       SET next_run_at = p_next_run_at,
           last_run_at = p_last_run_at,
           last_status = p_last_status,
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

CREATE OR REPLACE FUNCTION schedule_claim_next(
    p_owner text, p_now bigint, p_lease_ms bigint, p_limit integer, p_ids text[] DEFAULT NULL
) RETURNS SETOF schedules
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    PERFORM check_positive('limit', p_limit);
    IF EXISTS (SELECT FROM unnest(p_ids) AS i(id)
                WHERE i.id IS NULL OR i.id = '' OR length(i.id) > 1024) THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'ids must hold non-empty strings of at most 1024 characters';
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps

    -- Two static statements, not one filtered by "p_ids IS NULL OR c.id =
    -- ANY (p_ids)": after a few calls plpgsql runs a generic plan, which
    -- cannot know which side of that OR holds, so it read every row and
    -- searched the whole array for each one (20 ms for 1,000 ids over 1,000
    -- rows). Given ids, the generic plan now probes the primary key once
    -- per id, whatever the size of the table.
    --
    -- ARRAY(subquery) is an InitPlan: the candidates are locked and collected
    -- once, so no plan can re-scan them and claim more than p_limit rows.
    IF p_ids IS NULL THEN
        RETURN QUERY
        WITH claimed AS (
            UPDATE schedules s
               SET lease_owner = p_owner,
                   lease_until = v_until,
                   fencing_token = s.fencing_token + 1
             WHERE s.id = ANY (ARRAY(
                       SELECT c.id
                         FROM schedules c
                        WHERE c.next_run_at IS NOT NULL
                          AND c.next_run_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.next_run_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY next_run_at, id;
    ELSE
        RETURN QUERY
        WITH claimed AS (
            UPDATE schedules s
               SET lease_owner = p_owner,
                   lease_until = v_until,
                   fencing_token = s.fencing_token + 1
             WHERE s.id = ANY (ARRAY(
                       SELECT c.id
                         FROM schedules c
                        WHERE c.id = ANY (p_ids)
                          AND c.next_run_at IS NOT NULL
                          AND c.next_run_at <= v_now
                          AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                        ORDER BY c.next_run_at, c.id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING s.*
        )
        SELECT * FROM claimed ORDER BY next_run_at, id;
    END IF;
END
$$;

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The scalar subquery is an InitPlan: it runs once, walks the pending
    -- index in lease order and locks one row, skipping rows that concurrent
    -- leasers hold locked.
    RETURN QUERY
    UPDATE jobs j
       SET lease_holder = p_holder,
           lease_until = v_until
     WHERE j.run_id = (
               SELECT c.run_id
                 FROM jobs c
                WHERE NOT c.dispatched
                  AND NOT c.cancelled
                  AND c.dispatch_at <= v_now
                  AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                ORDER BY c.dispatch_at, c.run_id
                LIMIT 1
                  FOR UPDATE SKIP LOCKED)
    RETURNING j.*;
END
$$;

CREATE OR REPLACE FUNCTION job_renew(
    p_run_id text, p_holder text, p_now bigint, p_ttl_ms bigint
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_renewed boolean;
BEGIN
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    UPDATE jobs
       SET lease_until = v_until
     WHERE run_id = p_run_id
       AND lease_holder = p_holder
       AND lease_until > v_now
    RETURNING true INTO v_renewed;
    RETURN coalesce(v_renewed, false);
END
$$;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0006'::text $$;

REVOKE ALL ON FUNCTION check_length(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_now(bigint) FROM PUBLIC;
REVOKE ALL ON TABLE store_settings FROM PUBLIC;
