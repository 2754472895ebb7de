-- pgstore 0014, upgrade: fences on the job store.
--
-- * job_remove (granted to the client role) deletes only a job that waits
--   (not dispatched, cancelled or failed) and holds no lease (lease_holder IS
--   NULL); any other job: 55000 (object_not_in_prerequisite_state) naming its
--   state, and nothing changes. Erasing history stays the owner's (job_purge).
-- * job_fences: one row, the high-water mark of the lease sequences of the
--   jobs job_purge and job_remove delete, raised in the statement that deletes.
--   job_lease and job_lease_many hand out lease sequences above it, reading it
--   in the leasing UPDATE itself, so a run_id deleted and scheduled again never
--   repeats a (run_id, lease_sequence). It starts at 0: the jobs deleted before
--   this revision left no mark.
-- * store_settings.max_lease_ms bounds every lease end a call sets (lease_ms,
--   ttl_ms, and schedule_renew's lease_until past now_ms()); NULL: one day
--   while max_clock_skew_ms is set, else none. check_lease reads both bounds
--   with one read of store_settings.
-- * A job is leased at most max_attempts times: job_lease and job_lease_many
--   fail a due job whose attempts >= max_attempts (its last lease expired
--   without a release) instead of leasing it, and leave it out of the answer.
--
-- Same signatures: CREATE OR REPLACE keeps each function's owner and grants;
-- the comments that changed are set again. No row changes.

CREATE TABLE job_fences (
    singleton      boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    lease_sequence bigint NOT NULL DEFAULT 0 CHECK (lease_sequence >= 0)
);

INSERT INTO job_fences DEFAULT VALUES;

COMMENT ON TABLE job_fences IS
'One row: the high-water mark of the lease sequences of every job deleted (by job_purge '
'or job_remove). Written only by those two functions, read by every lease; clients can '
'neither read nor write it.';
COMMENT ON COLUMN job_fences.singleton IS
'Always true: the primary key that keeps the table to one row.';
COMMENT ON COLUMN job_fences.lease_sequence IS
'The greatest lease_sequence of any job deleted since pgstore_0014 (0: none), raised in '
'the statement that deletes, never lowered. job_lease and job_lease_many hand out '
'lease sequences above it, so a run_id scheduled again never repeats one.';

REVOKE ALL ON TABLE job_fences FROM PUBLIC;

ALTER TABLE store_settings ADD COLUMN max_lease_ms bigint CHECK (max_lease_ms > 0);

COMMENT ON COLUMN store_settings.max_lease_ms IS
'The longest lease a call may set, in ms: p_lease_ms of schedule_claim_due and '
'schedule_claim_next, p_ttl_ms of job_lease, job_lease_many, job_renew and '
'job_renew_many, and p_lease_until - now_ms() of schedule_renew (a past '
'p_lease_until is allowed). Longer: 22023 naming the parameter, nothing changes. '
'NULL (the default): 86400000 (one day) while max_clock_skew_ms is set, else no bound.';

CREATE FUNCTION check_lease(p_now bigint, p_param text, p_lease bigint) RETURNS bigint
LANGUAGE plpgsql
AS $$
-- What every call that sets a lease end runs instead of check_now, as
-- "v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms)": one read of the settings
-- for both bounds, on the database-clock path too (the lease bound applies
-- there; the bound on now does not). Like check_now it runs as its caller, an
-- API function: as the store's owner, on that function's pinned search_path.
-- p_param 'lease_until' (schedule_renew) means p_lease is an instant, whose
-- distance from now_ms() is bounded; any other p_param names a duration.
DECLARE
    v_skew  bigint;
    v_bound bigint;
    v_set   bigint;
    v_clock bigint;
    v_lease numeric;
BEGIN
    SELECT s.max_clock_skew_ms, s.max_lease_ms INTO v_skew, v_set FROM store_settings s;
    -- With the bound on now set and none on leases, a lease is still bounded (a
    -- day): a client that may not pass a far now may not hold a lease for ever.
    v_bound := coalesce(v_set, CASE WHEN v_skew IS NOT NULL THEN 86400000 END);
    v_clock := now_ms();
    -- numeric: the differences may fall outside bigint's range.
    IF p_now IS NOT NULL AND abs(p_now::numeric - v_clock) > v_skew THEN
        PERFORM raise_invalid(format(
            'now must be within %s ms of the database clock (now - now_ms() = %s ms)',
            v_skew, p_now::numeric - v_clock));
    END IF;
    v_lease := CASE WHEN p_param = 'lease_until' THEN p_lease::numeric - v_clock
                    ELSE p_lease END;
    IF v_lease > v_bound THEN
        PERFORM raise_invalid(format(
            '%s must be at most %s ms%s (store_settings.max_lease_ms%s)',
            p_param, v_bound,
            CASE WHEN p_param = 'lease_until'
                 THEN format(' past the database clock (lease_until - now_ms() = %s ms)', v_lease)
                 ELSE '' END,
            CASE WHEN v_set IS NULL THEN ', one day while only max_clock_skew_ms is set'
                 ELSE '' END));
    END IF;
    RETURN coalesce(p_now, v_clock);
END
$$;

COMMENT ON FUNCTION check_lease(bigint, text, bigint) IS
'Returns p_now (NULL: now_ms()); raises 22023 naming now as check_now does, or naming '
'p_param when the lease p_lease (a duration; for p_param ''lease_until'', an instant '
'less now_ms()) is longer than store_settings.max_lease_ms (NULL: one day while '
'max_clock_skew_ms is set, else no bound). One read of store_settings. Called by every '
'function that sets a lease end.';

REVOKE ALL ON FUNCTION check_lease(bigint, text, bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT 'pgstore_0014'::text $$;

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
    v_now := check_lease(p_now, 'lease_ms', p_lease_ms);
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
'claimers of one id get exactly one winner. 22023: p_lease_ms above '
'store_settings.max_lease_ms.';

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
    -- A lease end at most store_settings.max_lease_ms past the database clock;
    -- one in the past is fine (it gives the lease up). check_lease never answers
    -- NULL: a condition, like an assignment, costs no query of its own (PERFORM
    -- would).
    IF check_lease(NULL, 'lease_until', p_lease_until) IS NULL THEN
        RETURN false;
    END IF;

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
'lease was lost: claimed again, completed, re-registered or deleted. A past '
'p_lease_until gives the lease up. 22023: p_lease_until more than '
'store_settings.max_lease_ms past now_ms().';

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
    v_now := check_lease(p_now, 'lease_ms', p_lease_ms);
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
'now, not that nothing is due. 22023: p_lease_ms above store_settings.max_lease_ms.';

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
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
    v_until := v_now + p_ttl_ms;  -- raises 22003 on overflow, never wraps

    -- The scalar subquery on run_id is an InitPlan: it runs once, walks the
    -- pending index in lease order and locks one row, skipping rows that
    -- concurrent leasers hold locked. The one on job_fences is read in this
    -- statement, with its snapshot: a row visible to it was scheduled after
    -- any purge or remove of its run_id that the mark must cover.
    --
    -- A job out of attempts (its last lease expired without a release) is
    -- failed instead, by the same UPDATE, and not returned: the call then
    -- answers no row, and the next call leases the next job.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1, token_floor(),
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
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
        RETURNING j.*)
    SELECT l.* FROM leased l WHERE NOT l.failed;
END
$$;

COMMENT ON FUNCTION job_lease(text, bigint, bigint) IS
'Leases to p_holder, until now + p_ttl_ms, the next due (dispatch_at <= now), '
'uncancelled, undispatched, unfailed job whose lease is absent or expired, earliest '
'dispatch_at first (ties by run_id), bumps its lease_sequence (to at least '
'token_floor(): above every lease of an earlier timeline, and above '
'job_fences.lease_sequence: above every lease of a deleted job) and adds one to its '
'attempts. Returns it, with the new lease_sequence and attempts, or no row. A job is '
'leased at most max_attempts times: when that next job has attempts >= max_attempts '
'(its last lease expired without a release) it is failed instead (failed, '
'finished_at = now_ms(), lease cleared, last_error says why) and no row is returned. '
'One UPDATE; rows locked by concurrent leasers are skipped, so an empty answer means '
'nothing leasable right now, not that nothing is due. Two callers never hold one job '
'while its lease lives. 22023: p_ttl_ms above store_settings.max_lease_ms.';

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
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
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
'must stop. 22023: p_ttl_ms above store_settings.max_lease_ms.';

CREATE OR REPLACE FUNCTION job_remove(p_run_id text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_job jobs;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- Granted to the client role, so it must not erase what was dispatched (the
    -- owner's job_purge deletes history), nor a job a dispatcher may still be
    -- dispatching: one with a lease holder, even an expired one (a dispatch can
    -- outlive its lease, and its mark must then find the row). The row lock, as
    -- in job_cancel, orders this call against a concurrent lease or mark: it
    -- waits for that commit and then decides on the newest row.
    SELECT * INTO v_job FROM jobs j WHERE j.run_id = p_run_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_job.dispatched OR v_job.cancelled OR v_job.failed
       OR v_job.lease_holder IS NOT NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = 'object_not_in_prerequisite_state',
            MESSAGE = format(
                'job %s is %s: job_remove deletes only a waiting job that holds no lease',
                quote_literal(p_run_id),
                CASE WHEN v_job.dispatched THEN 'dispatched'
                     WHEN v_job.cancelled THEN 'cancelled'
                     WHEN v_job.failed THEN 'failed'
                     ELSE format('leased by %s (lease_sequence %s; a dispatch may be running)',
                                 quote_literal(v_job.lease_holder), v_job.lease_sequence)
                END),
            HINT = 'Cancel it with job_cancel instead; the schema''s owner deletes finished '
                   'jobs with job_purge.';
    END IF;

    -- One statement: the delete and the fence it raises (never lowers).
    WITH gone AS (
        DELETE FROM jobs j WHERE j.run_id = p_run_id RETURNING j.lease_sequence)
    UPDATE job_fences f
       SET lease_sequence = g.lease_sequence
      FROM gone g
     WHERE g.lease_sequence > f.lease_sequence;
END
$$;

COMMENT ON FUNCTION job_remove(text) IS
'Deletes the job p_run_id when it waits (not dispatched, cancelled or failed) and '
'holds no lease (lease_holder IS NULL: never leased, or released), and raises '
'job_fences.lease_sequence to its lease_sequence. Unknown run_id: nothing. A '
'dispatched, cancelled, failed or leased job (even one whose lease expired: its '
'dispatch may still be running): 55000 (object_not_in_prerequisite_state) naming its '
'state, and nothing changes; cancel it instead (job_cancel), and the owner deletes '
'finished jobs with job_purge.';

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
    --
    -- The same statement raises job_fences to the greatest lease_sequence it
    -- deleted (never lowers it): a run_id scheduled again is leased above it.
    -- Only a purge that raises the mark writes its row, so two such purges (or
    -- a purge and a job_remove) take turns on it until the first commits.
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
        RETURNING j.lease_sequence),
    fenced AS (
        UPDATE job_fences f
           SET lease_sequence = g.top
          FROM (SELECT max(d.lease_sequence) AS top FROM gone d) g
         WHERE g.top > f.lease_sequence)
    SELECT count(*) INTO v_deleted FROM gone;
    RETURN v_deleted;
END
$$;

COMMENT ON FUNCTION job_purge(bigint, integer) IS
'Deletes at most p_limit finished jobs (dispatched, cancelled or failed) whose finished_at '
'< p_before, oldest first, and returns how many it deleted. Never a waiting job, '
'nor one whose lease is live; rows locked by concurrent calls are skipped (a purge '
'never waits on a lease, a mark or a cancel), so a short answer does not mean '
'nothing is left. Call it until it returns less than p_limit. Raises '
'job_fences.lease_sequence to the greatest lease_sequence it deleted, in the same '
'statement. 22023: p_before NULL or negative, p_limit NULL or not positive. Not '
'granted to the client role: it deletes history.';

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
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
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
    --
    -- job_lease's rules for each job: job_fences is read by this statement (an
    -- InitPlan, once), never by an earlier one, and a job out of attempts is
    -- failed by this UPDATE instead of leased, and left out of the answer, so
    -- it may hold fewer than p_limit rows.
    RETURN QUERY
    WITH leased AS (
        UPDATE jobs j
           SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
               lease_until = CASE WHEN j.attempts < j.max_attempts THEN v_until END,
               lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                     THEN greatest(j.lease_sequence + 1, v_floor,
                                                   (SELECT f.lease_sequence + 1
                                                      FROM job_fences f))
                                     ELSE j.lease_sequence END,
               attempts = CASE WHEN j.attempts < j.max_attempts
                               THEN j.attempts + 1 ELSE j.attempts END,
               failed = j.attempts >= j.max_attempts,
               finished_at = CASE WHEN j.attempts < j.max_attempts
                                  THEN j.finished_at ELSE now_ms() END,
               last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                 ELSE format('out of attempts: leased %s times (max_attempts '
                                             '%s), the last lease expired without a release',
                                             j.attempts, j.max_attempts) END
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
    SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
END
$$;

COMMENT ON FUNCTION job_lease_many(text, bigint, bigint, integer) IS
'job_lease for up to p_limit jobs at once: leases to p_holder, until now + p_ttl_ms, '
'the next due, uncancelled, undispatched, unfailed jobs whose lease is absent or '
'expired, in lease order (dispatch_at, then run_id), bumping each one''s '
'lease_sequence and adding one to its attempts as job_lease does. A job among them '
'with attempts >= max_attempts (its last lease expired without a release) is failed '
'instead, as job_lease fails it, and not returned. Returns the leased jobs in that '
'order: fewer than p_limit (none) when no more are leasable right now, or when some '
'were failed; rows locked by concurrent leasers are skipped. One UPDATE. '
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
    v_now := check_lease(p_now, 'ttl_ms', p_ttl_ms);
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
'(A lease that expires without a release fails the job at the next job_lease instead.) '
'22023: p_error longer than 4096 characters.';

COMMENT ON COLUMN jobs.lease_sequence IS
'Bumped by every job_lease (to at least token_floor() and above job_fences.lease_sequence), '
'so it grows with every lease of the job and never goes backwards, even across a '
'promotion or a purge or remove of the run_id and its scheduling again; 0 until the '
'first lease. (run_id, lease_sequence) names one lease: an idempotency key for the '
'provider call.';
COMMENT ON COLUMN jobs.finished_at IS
'Epoch ms (the database clock) when the job finished: set by job_mark_dispatched, '
'by job_cancel of an undispatched job and by the job_release or job_lease that fails '
'it, once; '
'NULL while the job waits (job_retry clears it). '
'Jobs finished before pgstore_0009 got the time of that upgrade.';
COMMENT ON COLUMN jobs.max_attempts IS
'The most leases the job may have: a job is leased at most max_attempts times. Once '
'attempts >= max_attempts, a job_release of its last lease fails the job, and so does '
'the job_lease (or job_lease_many) that finds it due again after that lease expired. '
'job_schedule''s p_max_attempts, or store_settings.default_max_attempts '
'when the job was scheduled without one (job_schedule always writes it: the column''s '
'own default, 25, is for rows written otherwise).';
COMMENT ON COLUMN jobs.failed IS
'Terminal: set, once attempts >= max_attempts, by the job_release of the job''s last '
'lease or by the job_lease (or job_lease_many) that finds that lease expired. A failed '
'job is never leased again; job_retry puts it back to waiting, job_purge deletes it.';
