-- pgstore 0007, upgrade: fencing that survives failover.
--
-- * token_floor() = 2^40 * (timeline ID - 1): every claim lifts the fencing
--   token to at least it, and every lease the new jobs.lease_sequence, so
--   neither goes backwards when a promoted standby lost acknowledged commits
--   (on timeline 1 the floor is 0: nothing changes). A new id (or one
--   re-registered from its fence) starts at least at the floor too.
-- * Every API function that writes starts with check_primary(): on a standby
--   it raises 25006 naming the server as a standby, at once.
-- * jobs.lease_sequence (0 for the jobs already stored) is bumped by job_lease
--   and returned after the other columns; job_renew, job_mark_dispatched and
--   job_release take it as an optional last argument (DEFAULT NULL: calls
--   without it behave as before). Their signatures change, so they are
--   dropped and created again, and granted to the client role again (the
--   template beside this file); everything else is CREATE OR REPLACE, which
--   keeps owners and grants. The new helpers grant nothing to clients.

CREATE FUNCTION check_sequence(p_value bigint) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value <= 0
                THEN raise_invalid('lease_sequence must be a positive integer or null')
           END
$$;

COMMENT ON FUNCTION check_sequence(bigint) IS
'Raises 22023 naming lease_sequence unless p_value is NULL (no fence) or positive '
'(what job_lease returns).';

CREATE FUNCTION raise_standby() RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'read_only_sql_transaction',
        MESSAGE = 'this server is a standby (in recovery): pgstore writes only on the primary',
        HINT = 'Connect to the primary, e.g. with target_session_attrs=read-write in a '
               'conninfo that lists every server.';
END
$$;

COMMENT ON FUNCTION raise_standby() IS
'Raises 25006 (read_only_sql_transaction) saying the server is a standby; what '
'check_primary calls on a server in recovery.';

CREATE FUNCTION check_primary() RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN pg_is_in_recovery() THEN raise_standby() END
$$;

COMMENT ON FUNCTION check_primary() IS
'Raises 25006 naming the server as a standby when it is in recovery; the first '
'statement of every API function that writes, so a call on a standby fails at once.';

CREATE FUNCTION token_floor() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    -- The first 8 hex digits of a WAL file name are its timeline ID. The
    -- product (not a shift, which wraps) raises 22003 beyond timeline 2^23.
    SELECT (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1)
           * 1099511627776
$$;

COMMENT ON FUNCTION token_floor() IS
'2^40 * (the server''s timeline ID - 1): the least fencing token and lease '
'sequence a write may hand out, so none goes backwards across a promotion (0 on '
'timeline 1). Only on a primary: check_primary first.';

ALTER TABLE jobs
    ADD COLUMN lease_sequence bigint NOT NULL DEFAULT 0 CHECK (lease_sequence >= 0);

COMMENT ON COLUMN jobs.lease_sequence IS
'Bumped by every job_lease (to at least token_floor()), so it grows with every lease '
'of the job and never goes backwards, even across a promotion; 0 until the first lease. '
'(run_id, lease_sequence) names one lease: an idempotency key for the provider call.';

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0007'::text $$;

COMMENT ON FUNCTION schema_revision() IS
'The migration revision this schema''s objects were built by. The Python '
'stores compare it with their migration head at start().';

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
    v_floor bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_name('owner', p_owner);
    PERFORM check_positive('lease_ms', p_lease_ms);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_lease_ms;  -- raises 22003 on overflow, never wraps
    v_floor := token_floor();  -- once per call, not per row

    RETURN QUERY
    UPDATE schedules s
       SET lease_owner = p_owner,
           lease_until = v_until,
           fencing_token = greatest(s.fencing_token + 1, v_floor)
     WHERE s.id = p_id
       AND s.next_run_at IS NOT NULL
       AND s.next_run_at <= v_now
       AND (s.lease_until IS NULL OR s.lease_until <= v_now)
    RETURNING s.*;
END
$$;

COMMENT ON FUNCTION schedule_claim_due(text, text, bigint, bigint) IS
'Claims p_id for p_owner until now + p_lease_ms and bumps its fencing_token '
'(to at least token_floor(): above every token of an earlier timeline), '
'only when it is due (next_run_at IS NOT NULL AND next_run_at <= now) and has '
'no live lease (lease_until IS NULL OR lease_until <= now). Returns the claimed '
'row, or no row: not due, leased elsewhere, or unknown. One UPDATE; concurrent '
'claimers of one id get exactly one winner.';

CREATE OR REPLACE FUNCTION schedule_renew(
    p_id text, p_fencing_token bigint, p_lease_until bigint
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_renewed boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);
    PERFORM check_present('fencing_token', p_fencing_token);
    PERFORM check_present('lease_until', p_lease_until);

    UPDATE schedules
       SET lease_until = p_lease_until
     WHERE id = p_id
       AND fencing_token = p_fencing_token
       AND lease_owner IS NOT NULL
    RETURNING true INTO v_renewed;
    RETURN coalesce(v_renewed, false);
END
$$;

COMMENT ON FUNCTION schedule_renew(text, bigint, bigint) IS
'Sets lease_until = p_lease_until only if p_fencing_token matches and the claim '
'is still held (lease_owner IS NOT NULL: not yet completed). False means the '
'lease was lost: claimed again, completed, re-registered or deleted.';

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

COMMENT ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) IS
'Commits an occurrence only if p_fencing_token matches and the claim is still '
'held: writes next_run_at (NULL = tombstone), last_run_at and last_status, '
'clears the lease, updated_at = now. False when stale (claimed again since), '
'already completed, re-registered or deleted; then nothing changes.';

CREATE OR REPLACE FUNCTION schedule_delete(p_id text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('id', p_id);

    WITH gone AS (
        DELETE FROM schedules WHERE id = p_id RETURNING id, fencing_token
    )
    INSERT INTO schedule_fences AS f (id, fencing_token)
    SELECT id, fencing_token FROM gone
    ON CONFLICT (id) DO UPDATE
        SET fencing_token = excluded.fencing_token
        WHERE f.fencing_token < excluded.fencing_token;
END
$$;

COMMENT ON FUNCTION schedule_delete(text) IS
'Removes the record of p_id and raises its high-water mark in schedule_fences '
'to the deleted token (never lowers it), in one statement. Unknown id: nothing.';

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
    v_floor bigint;
BEGIN
    PERFORM check_primary();
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
    v_floor := token_floor();  -- once per call, not per row

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
                   fencing_token = greatest(s.fencing_token + 1, v_floor)
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
                   fencing_token = greatest(s.fencing_token + 1, v_floor)
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

COMMENT ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) IS
'Claims up to p_limit due, unleased records for p_owner (earliest next_run_at '
'first, ties by id), bumping each fencing_token (to at least token_floor()), in '
'one statement; rows locked '
'by concurrent claimers are skipped. Only ids in p_ids when given (''{}'' claims '
'nothing, NULL means no filter). Returns the claimed rows in that order. '
'Never more than p_limit rows. An empty answer means nothing claimable right '
'now, not that nothing is due.';

CREATE OR REPLACE FUNCTION job_schedule(p_run_id text, p_dispatch_at bigint) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
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

COMMENT ON FUNCTION job_schedule(text, bigint) IS
'Adds the job p_run_id, due at p_dispatch_at. For an existing job moves only '
'dispatch_at: lease, worker_id, dispatched and cancelled are preserved. At commit, '
'notifies job_channel() with dispatch_at as the payload.';

CREATE OR REPLACE FUNCTION job_lease(p_holder text, p_now bigint, p_ttl_ms bigint) RETURNS SETOF jobs
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now   bigint;
    v_until bigint;
BEGIN
    PERFORM check_primary();
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
           lease_until = v_until,
           lease_sequence = greatest(j.lease_sequence + 1, token_floor())
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

COMMENT ON FUNCTION job_lease(text, bigint, bigint) IS
'Leases to p_holder, until now + p_ttl_ms, the next due (dispatch_at <= now), '
'uncancelled, undispatched job whose lease is absent or expired, earliest '
'dispatch_at first (ties by run_id), and bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline). Returns it, with the '
'new lease_sequence, or no row. One UPDATE; rows '
'locked by concurrent leasers are skipped, so an empty answer means nothing '
'leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives.';

CREATE OR REPLACE FUNCTION job_cancel(p_run_id text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_dispatched boolean;
    v_cancelled  boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- The row lock orders this call against a concurrent job_mark_dispatched:
    -- it waits for that commit and then reads the dispatched row.
    SELECT j.dispatched, j.cancelled INTO v_dispatched, v_cancelled
      FROM jobs j
     WHERE j.run_id = p_run_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    ELSIF v_dispatched THEN
        RETURN 'already_dispatched';
    ELSIF NOT v_cancelled THEN
        UPDATE jobs SET cancelled = true WHERE run_id = p_run_id;
    END IF;
    RETURN 'cancelled';
END
$$;

COMMENT ON FUNCTION job_cancel(text) IS
'Cancels p_run_id: ''cancelled'' (also when it already was, and when a lease is '
'live: its dispatcher learns it from job_mark_dispatched), ''already_dispatched'' '
'(nothing changes: the caller tells the bot to leave), or ''missing''.';

CREATE OR REPLACE FUNCTION job_remove(p_run_id text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    DELETE FROM jobs WHERE run_id = p_run_id;
END
$$;

COMMENT ON FUNCTION job_remove(text) IS
'Deletes the job p_run_id. Unknown run_id: nothing.';

DROP FUNCTION job_renew(text, text, bigint, bigint);

CREATE FUNCTION job_renew(
    p_run_id text, p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequence bigint DEFAULT NULL
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
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_sequence(p_lease_sequence);
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    UPDATE jobs
       SET lease_until = v_until
     WHERE run_id = p_run_id
       AND lease_holder = p_holder
       AND lease_until > v_now
       AND (p_lease_sequence IS NULL OR lease_sequence = p_lease_sequence)
    RETURNING true INTO v_renewed;
    RETURN coalesce(v_renewed, false);
END
$$;

COMMENT ON FUNCTION job_renew(text, text, bigint, bigint, bigint) IS
'Extends p_holder''s lease on p_run_id to now + p_ttl_ms, only if p_holder holds '
'an unexpired lease (lease_until > now) and, when p_lease_sequence is given, it is '
'that lease (lease_sequence = p_lease_sequence); true even when the job is cancelled or '
'dispatched. False: the lease expired or another holder took it, and the holder '
'must stop.';

REVOKE ALL ON FUNCTION job_renew(text, text, bigint, bigint, bigint) FROM PUBLIC;

DROP FUNCTION job_mark_dispatched(text, text, text);

CREATE FUNCTION job_mark_dispatched(
    p_run_id text, p_holder text, p_worker_id text, p_lease_sequence bigint DEFAULT NULL
) RETURNS TABLE (cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_cancelled boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    IF length(p_worker_id) > 1024 THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'worker_id must be a string of at most 1024 characters';
    END IF;
    PERFORM check_sequence(p_lease_sequence);

    -- Under READ COMMITTED a concurrent job_cancel either committed before
    -- this UPDATE took the row lock (the re-checked row then says cancelled)
    -- or waits for it and then sees the job dispatched.
    UPDATE jobs j
       SET dispatched = true,
           worker_id = p_worker_id
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
    RETURNING j.cancelled INTO v_cancelled;
    IF FOUND THEN
        RETURN QUERY SELECT v_cancelled, true;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT coalesce((SELECT j.cancelled FROM jobs j WHERE j.run_id = p_run_id), false), false;
END
$$;

COMMENT ON FUNCTION job_mark_dispatched(text, text, text, bigint) IS
'Records the dispatch of p_run_id by p_holder (its lease may have expired: a '
'dispatch can outlive its lease) with p_worker_id (NULL allowed): one row '
'(cancelled, recorded). recorded = true when lease_holder = p_holder (and, when '
'p_lease_sequence is given, lease_sequence = p_lease_sequence), and then '
'cancelled says whether a cancel arrived (tell the bot to leave at once). '
'Another holder (or lease) took the job, or it is gone: nothing changes, recorded = false, '
'cancelled = the stored flag (false for a missing job). The lease is left as it is.';

REVOKE ALL ON FUNCTION job_mark_dispatched(text, text, text, bigint) FROM PUBLIC;

DROP FUNCTION job_release(text, text, bigint);

CREATE FUNCTION job_release(
    p_run_id text, p_holder text, p_retry_at bigint, p_lease_sequence bigint DEFAULT NULL
) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_released boolean;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    PERFORM check_name('holder', p_holder);
    PERFORM check_present('retry_at', p_retry_at);
    PERFORM check_sequence(p_lease_sequence);

    UPDATE jobs
       SET lease_holder = NULL,
           lease_until = NULL,
           dispatch_at = p_retry_at
     WHERE run_id = p_run_id
       AND lease_holder = p_holder
       AND NOT dispatched
       AND (p_lease_sequence IS NULL OR lease_sequence = p_lease_sequence)
    RETURNING true INTO v_released;
    RETURN coalesce(v_released, false);
END
$$;

COMMENT ON FUNCTION job_release(text, text, bigint, bigint) IS
'Gives up p_holder''s lease on p_run_id without dispatching (the dispatch failed '
'and will be retried): clears the lease and moves dispatch_at to p_retry_at. '
'Only while lease_holder = p_holder (expired or not; and, when p_lease_sequence '
'is given, lease_sequence = p_lease_sequence) and the job is not dispatched; else '
'false and nothing changes. The lease_sequence is kept: the next lease bumps it.';

REVOKE ALL ON FUNCTION job_release(text, text, bigint, bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION check_sequence(bigint) FROM PUBLIC;

REVOKE ALL ON FUNCTION check_primary() FROM PUBLIC;

REVOKE ALL ON FUNCTION raise_standby() FROM PUBLIC;

REVOKE ALL ON FUNCTION token_floor() FROM PUBLIC;
