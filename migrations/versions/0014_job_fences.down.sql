-- pgstore 0014, downgrade: back to pgstore_0013's bodies and comments (same
-- signatures: owners and grants are kept); check_lease, job_fences and
-- store_settings.max_lease_ms go. The jobs stay as they are (a job a lease
-- failed is a failed job at 0013 too).

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0013'::text $$;

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
           lease_sequence = greatest(j.lease_sequence + 1, token_floor()),
           attempts = j.attempts + 1
     WHERE j.run_id = (
               SELECT c.run_id
                 FROM jobs c
                WHERE NOT c.dispatched
                  AND NOT c.cancelled
                  AND NOT c.failed
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
'uncancelled, undispatched, unfailed job whose lease is absent or expired, earliest '
'dispatch_at first (ties by run_id), bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline) and adds one to its '
'attempts. Returns it, with the new lease_sequence and attempts, or no row. One UPDATE; rows '
'locked by concurrent leasers are skipped, so an empty answer means nothing '
'leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives.';

CREATE OR REPLACE FUNCTION job_renew(
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

CREATE OR REPLACE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_deleted bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_present('before', p_before);
    IF p_before < 0 THEN
        PERFORM raise_invalid('before must be a non-negative integer');
    END IF;
    PERFORM check_positive('limit', p_limit);
    v_now := now_ms();

    -- One statement. The walk reads the finished jobs' index, oldest first,
    -- and locks what it deletes, skipping rows a concurrent call holds locked
    -- (it never waits on a lease or a mark). A locked row is re-checked in its
    -- newest version, so a job whose lease is live (a dispatcher still holds
    -- a cancelled or dispatched job) is kept; a waiting job has no finished_at.
    WITH gone AS (
        DELETE FROM jobs j
         WHERE j.run_id IN (
                   SELECT c.run_id
                     FROM jobs c
                    WHERE c.finished_at IS NOT NULL
                      AND c.finished_at < p_before
                      AND (c.dispatched OR c.cancelled OR c.failed)
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.finished_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED)
        RETURNING 1)
    SELECT count(*) INTO v_deleted FROM gone;
    RETURN v_deleted;
END
$$;

COMMENT ON FUNCTION job_purge(bigint, integer) IS
'Deletes at most p_limit finished jobs (dispatched, cancelled or failed) whose finished_at '
'< p_before, oldest first, and returns how many it deleted. Never a waiting job, '
'nor one whose lease is live; rows locked by concurrent calls are skipped (a purge '
'never waits on a lease, a mark or a cancel), so a short answer does not mean '
'nothing is left. Call it until it returns less than p_limit. 22023: p_before NULL '
'or negative, p_limit NULL or not positive. Not granted to the client role: it '
'deletes history.';

CREATE OR REPLACE FUNCTION job_lease_many(
    p_holder text, p_now bigint, p_ttl_ms bigint, p_limit integer
) RETURNS SETOF jobs
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
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_positive('limit', p_limit);
    IF p_limit > batch_max() THEN
        PERFORM raise_invalid(format('limit must be at most %s', batch_max()));
    END IF;
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps
    -- Once per call, not once per row (token_floor() is VOLATILE: inlined into
    -- the SET list it read the WAL position for every job). One value is right
    -- for the whole batch: a primary writes on one timeline for as long as it
    -- runs, and check_primary() above has refused a standby.
    v_floor := token_floor();

    -- job_lease's walk with LIMIT p_limit: the ARRAY() subquery is an InitPlan
    -- that runs once, walks the pending index in lease order and locks up to
    -- p_limit rows, skipping rows concurrent leasers hold locked; the UPDATE then
    -- reaches them through the primary key (an IN would let the planner hash-join
    -- a scan of the whole table). The answer comes back in lease order.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = p_holder,
               lease_until = v_until,
               lease_sequence = greatest(j.lease_sequence + 1, v_floor),
               attempts = j.attempts + 1
         WHERE j.run_id = ANY (ARRAY(
                   SELECT c.run_id
                     FROM jobs c
                    WHERE NOT c.dispatched
                      AND NOT c.cancelled
                      AND NOT c.failed
                      AND c.dispatch_at <= v_now
                      AND (c.lease_until IS NULL OR c.lease_until <= v_now)
                    ORDER BY c.dispatch_at, c.run_id
                    LIMIT p_limit
                      FOR UPDATE SKIP LOCKED))
        RETURNING j.*)
    SELECT l.* FROM leased l ORDER BY l.dispatch_at, l.run_id;
END
$$;

COMMENT ON FUNCTION job_lease_many(text, bigint, bigint, integer) IS
'job_lease for up to p_limit jobs at once: leases to p_holder, until now + p_ttl_ms, '
'the next due, uncancelled, undispatched, unfailed jobs whose lease is absent or '
'expired, in lease order (dispatch_at, then run_id), bumping each one''s '
'lease_sequence and adding one to its attempts as job_lease does. Returns them in that order: fewer than p_limit (none) when no more '
'are leasable right now; rows locked by concurrent leasers are skipped. One UPDATE. '
'22023: p_limit NULL, not positive or above batch_max(), and job_lease''s rules.';

CREATE OR REPLACE FUNCTION job_renew_many(
    p_run_ids text[], p_holder text, p_now bigint, p_ttl_ms bigint,
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, renewed boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now     bigint;
    v_until   bigint;
    v_fences  jsonb;  -- run_id -> lease_sequence; NULL when no array is given
    v_renewed jsonb;  -- run_id -> true, for the leases the UPDATE extended
BEGIN
    PERFORM check_primary();
    PERFORM check_run_ids(p_run_ids);
    PERFORM check_name('holder', p_holder);
    PERFORM check_positive('ttl_ms', p_ttl_ms);
    PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- As job_mark_dispatched_many: the fences looked up by run_id in a jsonb
    -- object (a binary search), not joined, so the call's cost grows with the
    -- batch, not with its square, in any plan; the rows reached through the
    -- primary key.
    v_fences := jsonb_object(p_run_ids, p_lease_sequences::text[]);

    WITH renewed AS (
        UPDATE jobs j
           SET lease_until = v_until
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_until > v_now
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
        RETURNING j.run_id)
    SELECT jsonb_object(array_agg(r.run_id), array_agg('true'::text))
      INTO v_renewed  -- NULL when no lease was extended
      FROM renewed r;

    RETURN QUERY
    SELECT u.run_id, (v_renewed ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

COMMENT ON FUNCTION job_release(text, text, bigint, bigint, text) IS
'Gives up p_holder''s lease on p_run_id without dispatching (the dispatch failed): '
'clears the lease, records p_error (when not NULL) as last_error, and either moves '
'dispatch_at to p_retry_at (attempts < max_attempts: it will be retried) or fails '
'the job (attempts >= max_attempts: failed, finished_at = now unless a cancel set it, '
'dispatch_at kept; never leased again). '
'Only while lease_holder = p_holder (expired or not; and, when p_lease_sequence '
'is given, lease_sequence = p_lease_sequence) and the job is not dispatched; else '
'false and nothing changes. The lease_sequence is kept: the next lease bumps it. '
'22023: p_error longer than 4096 characters.';

COMMENT ON COLUMN jobs.lease_sequence IS
'Bumped by every job_lease (to at least token_floor()), so it grows with every lease '
'of the job and never goes backwards, even across a promotion; 0 until the first lease. '
'(run_id, lease_sequence) names one lease: an idempotency key for the provider call.';
COMMENT ON COLUMN jobs.finished_at IS
'Epoch ms (the database clock) when the job finished: set by job_mark_dispatched, '
'by job_cancel of an undispatched job and by the job_release that fails it, once; '
'NULL while the job waits (job_retry clears it). '
'Jobs finished before pgstore_0009 got the time of that upgrade.';
COMMENT ON COLUMN jobs.max_attempts IS
'The most leases the job may have: a job_release once attempts >= max_attempts fails '
'the job. job_schedule''s p_max_attempts, or store_settings.default_max_attempts '
'when the job was scheduled without one (job_schedule always writes it: the column''s '
'own default, 25, is for rows written otherwise).';
COMMENT ON COLUMN jobs.failed IS
'Terminal: set by the job_release that found attempts >= max_attempts. A failed job '
'is never leased again; job_retry puts it back to waiting, job_purge deletes it.';

DROP FUNCTION check_lease(bigint, text, bigint);

ALTER TABLE store_settings DROP COLUMN max_lease_ms;

DROP TABLE job_fences;
