-- pgstore 0028, upgrade: written by make revision from sql/; 0028_stats_counts.py says what and why.

-- job_history counts the recalled and failed jobs below its upto too, from the
-- rows as they are now: the writers of jobs wait meanwhile (the index's drop
-- needs this lock anyway), so no move of a counted job falls between the count
-- and the functions that tell job_history of it. The count reads the partial
-- index it replaces, before its drop.
LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE;

ALTER TABLE job_history
    ADD COLUMN recalled bigint NOT NULL DEFAULT 0 CHECK (recalled >= 0),
    ADD COLUMN failed bigint NOT NULL DEFAULT 0 CHECK (failed >= 0);

UPDATE job_history h
   SET recalled = c.recalled,
       failed = c.failed
  FROM (SELECT count(*) FILTER (WHERE j.dispatched) AS recalled,
               count(*) FILTER (WHERE NOT j.dispatched) AS failed
          FROM jobs j, job_history k
         WHERE ((j.dispatched AND j.cancelled)
                OR (j.failed AND NOT j.cancelled AND NOT j.dispatched))
           AND j.finished_at < k.upto) AS c;

DROP INDEX jobs_recalled_or_failed;

COMMENT ON TABLE job_history IS
'One row: the jobs that finished before upto (finished_at < upto) counted once, so '
'store_stats reads only the jobs that finished since. Written by job_history_advance '
'(called by store_stats) and job_history_move (job_purge, job_retry, job_cancel of a '
'failed job, job_mark_dispatched(_many) of a cancelled one); no one else may write it. '
'Starts at the smallest bigint: the first store_stats calls count the whole history once.';
COMMENT ON COLUMN job_history.recalled IS
'How many of them are dispatched and cancelled (recalled).';
COMMENT ON COLUMN job_history.failed IS
'How many of them are failed, and neither cancelled nor dispatched. The cancelled are '
'the rest: finished - dispatched - recalled - failed.';

CREATE OR REPLACE FUNCTION job_mark_dispatched(
    p_run_id text, p_holder text, p_worker_id text, p_lease_sequence bigint DEFAULT NULL
) RETURNS TABLE (cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_cancelled boolean;
    v_finished  bigint;
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
    -- or waits for it and then sees the job dispatched. A job already
    -- recalled (dispatched and cancelled) is left to the UPDATE below, so a
    -- cancelled job answered here was recalled by this very call, and only
    -- then is store_stats' history told (job_history_move), once.
    UPDATE jobs j
       SET dispatched = true,
           worker_id = p_worker_id,
           finished_at = coalesce(j.finished_at, now_ms())
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
       AND NOT (j.dispatched AND j.cancelled)
    RETURNING j.cancelled, j.finished_at INTO v_cancelled, v_finished;
    IF FOUND THEN
        IF v_cancelled THEN  -- a recall: the cancel's finished_at is kept
            PERFORM job_history_move(ARRAY[v_finished], ARRAY['cancelled'], ARRAY['recalled']);
        END IF;
        RETURN QUERY SELECT v_cancelled, true;
        RETURN;
    END IF;

    -- The mark repeated by the holder of a recalled job: the worker recorded
    -- again, as for any job; the recall was counted by the first mark.
    UPDATE jobs j
       SET worker_id = p_worker_id
     WHERE j.run_id = p_run_id
       AND j.lease_holder = p_holder
       AND (p_lease_sequence IS NULL OR j.lease_sequence = p_lease_sequence)
       AND j.dispatched AND j.cancelled;
    IF FOUND THEN
        RETURN QUERY SELECT true, true;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT coalesce((SELECT j.cancelled FROM jobs j WHERE j.run_id = p_run_id), false), false;
END
$$;

CREATE OR REPLACE FUNCTION job_retry(p_run_id text, p_dispatch_at bigint) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_at       bigint;
    v_finished bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);
    v_at := coalesce(p_dispatch_at, now_ms());

    -- The finished_at it clears, for job_history (store_stats' counts).
    UPDATE jobs j
       SET failed = false,
           attempts = 0,
           dispatch_at = v_at,
           finished_at = NULL
      FROM (SELECT o.finished_at FROM jobs o WHERE o.run_id = p_run_id FOR UPDATE) AS o
     WHERE j.run_id = p_run_id
       AND j.failed
       AND NOT j.cancelled
       AND NOT j.dispatched
    RETURNING o.finished_at INTO v_finished;
    IF FOUND THEN
        PERFORM job_history_move(ARRAY[v_finished], ARRAY['failed'], NULL);
        PERFORM pg_notify(job_channel(), v_at::text);
        RETURN 'retried';
    ELSIF EXISTS (SELECT FROM jobs j WHERE j.run_id = p_run_id) THEN
        RETURN 'not_failed';
    END IF;
    RETURN 'missing';
END
$$;

CREATE OR REPLACE FUNCTION job_cancel(p_run_id text) RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_dispatched boolean;
    v_cancelled  boolean;
    v_failed     boolean;
    v_finished   bigint;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('run_id', p_run_id);

    -- The row lock orders this call against a concurrent job_mark_dispatched:
    -- it waits for that commit and then reads the dispatched row.
    SELECT j.dispatched, j.cancelled, j.failed, j.finished_at
      INTO v_dispatched, v_cancelled, v_failed, v_finished
      FROM jobs j
     WHERE j.run_id = p_run_id
       FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'missing';
    ELSIF v_dispatched THEN
        RETURN 'already_dispatched';
    ELSIF NOT v_cancelled THEN
        UPDATE jobs
           SET cancelled = true,
               finished_at = coalesce(finished_at, now_ms())
         WHERE run_id = p_run_id;
        IF v_failed THEN  -- a failed job, finished already, now counts as cancelled
            PERFORM job_history_move(ARRAY[v_finished], ARRAY['failed'], ARRAY['cancelled']);
        END IF;
    END IF;
    RETURN 'cancelled';
END
$$;

CREATE OR REPLACE FUNCTION job_purge(p_before bigint, p_limit integer) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now        bigint;
    v_deleted    bigint;
    v_finished   bigint[];
    v_kinds      text[];
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
        RETURNING j.lease_sequence, j.finished_at,
                  CASE WHEN j.dispatched AND j.cancelled THEN 'recalled'
                       WHEN j.dispatched THEN 'dispatched'
                       WHEN j.cancelled THEN 'cancelled'
                       ELSE 'failed' END AS kind),
    fenced AS (
        UPDATE job_fences f
           SET lease_sequence = g.top
          FROM (SELECT max(d.lease_sequence) AS top FROM gone d) g
         WHERE g.top > f.lease_sequence)
    SELECT count(*), array_agg(g.finished_at), array_agg(g.kind)
      INTO v_deleted, v_finished, v_kinds
      FROM gone g;
    PERFORM job_history_move(v_finished, v_kinds, NULL);  -- store_stats' counts
    RETURN v_deleted;
END
$$;

CREATE OR REPLACE FUNCTION job_mark_dispatched_many(
    p_run_ids text[], p_holder text, p_worker_ids text[],
    p_lease_sequences bigint[] DEFAULT NULL
) RETURNS TABLE (run_id text, cancelled boolean, recorded boolean)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_worker_ids jsonb;       -- run_id -> worker_id
    v_fences     jsonb;       -- run_id -> lease_sequence; NULL when no array is given
    v_ids        text[];      -- the jobs the UPDATE recorded
    v_flags      boolean[];   -- and their cancelled flags
    v_marked     jsonb;       -- run_id -> cancelled, when some job was not recorded
    v_finished   bigint[];    -- the finished_at of the jobs this call recalled
    v_again      text[];      -- recalled jobs marked again by their holder
BEGIN
    PERFORM check_primary();
    -- Well-formed input costs one pass over the arrays, with no sort: every
    -- rule but "distinct" at once. Any doubt runs the checks one by one, in
    -- their order, for the first rule broken and its message. Distinct run ids
    -- are proven below, for free, when every job was recorded; otherwise
    -- check_run_ids raises for a repeat after the UPDATE, and the raise undoes
    -- it (nothing changes).
    IF p_run_ids IS NULL OR array_ndims(p_run_ids) > 1 OR cardinality(p_run_ids) > batch_max()
       OR p_holder IS NULL OR p_holder = '' OR length(p_holder) > 1024
       OR p_worker_ids IS NULL OR array_ndims(p_worker_ids) > 1
       OR cardinality(p_worker_ids) <> cardinality(p_run_ids)
       OR (p_lease_sequences IS NOT NULL
           AND (array_ndims(p_lease_sequences) > 1
                OR cardinality(p_lease_sequences) <> cardinality(p_run_ids)))
       OR EXISTS (SELECT FROM unnest(p_run_ids, p_worker_ids, p_lease_sequences) AS u(r, w, s)
                   WHERE r IS NULL OR r = '' OR length(r) > 1024 OR length(w) > 1024
                      OR s <= 0) THEN
        PERFORM check_run_ids(p_run_ids);
        PERFORM check_name('holder', p_holder);
        PERFORM check_same_length('worker_ids', p_worker_ids, cardinality(p_run_ids));
        IF EXISTS (SELECT FROM unnest(p_worker_ids) AS u(w) WHERE length(w) > 1024) THEN
            PERFORM raise_invalid('worker_ids must hold strings of at most 1024 characters');
        END IF;
        PERFORM check_lease_sequences(p_lease_sequences, cardinality(p_run_ids));
    END IF;

    -- Each job's own arguments are looked up by run_id in a jsonb object, not
    -- joined to the rows: jsonb keeps an object's keys sorted, so ->> is a
    -- binary search, and the call's cost grows with the batch, not with its
    -- square, whatever plan the planner picks. (Until pgstore_0013 they were
    -- a join with unnest(), which the generic plan plpgsql caches after five
    -- calls, estimating 10 input rows and 1 match, ran as a nested loop that
    -- rescanned the whole input for every job: "Rows Removed by Join Filter:
    -- 9900" for 100 jobs. A hash join, forced, costs as much as the lookups.)
    -- jsonb_object() is strict: no p_lease_sequences, no v_fences.
    v_worker_ids := jsonb_object(p_run_ids, p_worker_ids);
    v_fences := jsonb_object(p_run_ids, p_lease_sequences::text[]);

    -- job_mark_dispatched's UPDATE for every job at once, and its race rule:
    -- under READ COMMITTED a concurrent job_cancel either committed before this
    -- UPDATE took the row lock (the re-checked row then says cancelled, and
    -- RETURNING reports that row's flag) or waits for it and then sees the job
    -- dispatched. The rows are reached through the primary key (= ANY). A job
    -- without a fence (no array, or a NULL element) compares lease_sequence,
    -- which is NOT NULL, with itself.
    --
    -- A job already recalled (dispatched and cancelled) is left out, as
    -- job_mark_dispatched leaves it: a cancelled job answered here was recalled
    -- by this very call.
    --
    -- The clock is read once, by the first row the statement writes (an
    -- InitPlan, not now_ms()'s numeric arithmetic for every job): that row's
    -- write then takes the transaction's id, so, as with a clock read for
    -- each row, no job gets a finished_at older than the moment this
    -- transaction became visible as running (what job_history_advance's
    -- proposals wait on).
    WITH marked AS (
        UPDATE jobs j
           SET dispatched = true,
               worker_id = v_worker_ids ->> j.run_id,
               finished_at = coalesce(j.finished_at, (SELECT now_ms()))
         WHERE j.run_id = ANY (p_run_ids)
           AND j.lease_holder = p_holder
           AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint, j.lease_sequence)
           AND NOT (j.dispatched AND j.cancelled)
        RETURNING j.run_id, j.cancelled)
    SELECT array_agg(m.run_id), array_agg(m.cancelled)
      INTO v_ids, v_flags  -- NULL when nothing was recorded
      FROM marked m;

    -- One row per job, in the order given. Every job recorded (each row is
    -- updated once, so as many rows as run ids means they are distinct) and
    -- none cancelled, the common case: (run_id, false, true) for each, with
    -- no lookup.
    IF cardinality(v_ids) = cardinality(p_run_ids) THEN
        IF array_position(v_flags, true) IS NULL THEN
            RETURN QUERY SELECT u.run_id, false, true FROM unnest(p_run_ids) AS u(run_id);
            RETURN;
        END IF;
    ELSE
        PERFORM check_run_ids(p_run_ids);  -- a repeated run_id raises here
    END IF;

    -- The jobs this call recalled (cancelled before their mark): store_stats'
    -- history is told, once, with each cancel's finished_at (kept by the mark).
    IF array_position(v_flags, true) IS NOT NULL THEN
        SELECT array_agg(j.finished_at) INTO v_finished
          FROM unnest(v_ids, v_flags) AS u(run_id, cancelled)
          JOIN jobs j ON j.run_id = u.run_id
         WHERE u.cancelled;
        PERFORM job_history_move(v_finished,
                                 array_fill('cancelled'::text, ARRAY[cardinality(v_finished)]),
                                 array_fill('recalled'::text, ARRAY[cardinality(v_finished)]));
    END IF;

    -- A recalled job marked again by its holder: the worker recorded again, as
    -- job_mark_dispatched does (the UPDATE above left it out).
    IF cardinality(v_ids) IS DISTINCT FROM cardinality(p_run_ids) THEN
        WITH again AS (
            UPDATE jobs j
               SET worker_id = v_worker_ids ->> j.run_id
             WHERE j.run_id = ANY (p_run_ids)
               AND j.lease_holder = p_holder
               AND j.lease_sequence = coalesce((v_fences ->> j.run_id)::bigint,
                                               j.lease_sequence)
               AND j.dispatched AND j.cancelled
               AND NOT (j.run_id = ANY (coalesce(v_ids, '{}')))
            RETURNING j.run_id)
        SELECT array_agg(a.run_id) INTO v_again FROM again a;
        v_ids := v_ids || v_again;
        v_flags := v_flags || array_fill(true, ARRAY[coalesce(cardinality(v_again), 0)]);
    END IF;

    -- Otherwise a recorded job answers the flag its UPDATE returned. The others
    -- (another holder or lease took the job, or it is gone) answer the stored
    -- flag, read as job_mark_dispatched reads it: by a statement of its own
    -- after the UPDATE (under READ COMMITTED, as committed by then), through
    -- the primary key; false for a missing job.
    v_marked := jsonb_object(v_ids, v_flags::text[]);
    RETURN QUERY
    SELECT u.run_id,
           coalesce((v_marked ->> u.run_id)::boolean,
                    (SELECT s.cancelled FROM jobs s WHERE s.run_id = u.run_id),
                    false),
           (v_marked ->> u.run_id) IS NOT NULL
      FROM unnest(p_run_ids) WITH ORDINALITY AS u(run_id, ord)
     ORDER BY u.ord;
END
$$;

CREATE OR REPLACE FUNCTION job_history_advance() RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_upto bigint;
    v_next bigint;
    v_snap pg_snapshot;
    v_lag  bigint;
BEGIN
    -- Only where it can write, and under READ COMMITTED, where each statement
    -- below reads a snapshot taken after the row lock.
    IF pg_is_in_recovery()
       OR current_setting('transaction_read_only') = 'on'
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN;
    END IF;
    -- finished_at is the clock when the finishing statement ran, not when its
    -- transaction commits: a job can become visible with a finished_at below an
    -- upto already taken. So an upto is proposed first (the clock less a second,
    -- read before the snapshot) and taken only once every transaction that was
    -- running at that snapshot has ended: a transaction that had no xid then
    -- finishes jobs at a later clock. A proposal is made once upto is ten seconds
    -- behind (the setting pgstore.stats_lag_ms, in a session, changes that), so a
    -- call writes (and commits durably) at most about once per ten seconds
    -- whatever the rate of calls; the others only read the row.
    v_lag := coalesce(nullif(current_setting('pgstore.stats_lag_ms', true), '')::bigint, 10000);
    SELECT h.upto, h.next_upto, h.next_snapshot INTO v_upto, v_next, v_snap
      FROM job_history h;
    IF v_snap IS NULL AND v_upto > now_ms() - 1000 - v_lag THEN
        RETURN;  -- recent enough
    ELSIF v_snap IS NOT NULL AND EXISTS (
              SELECT FROM pg_snapshot_xip(v_snap) AS x(xid)
               WHERE pg_xact_status(x.xid) IS NOT DISTINCT FROM 'in progress') THEN
        RETURN;  -- the proposal waits for those transactions
    END IF;
    -- One advance at a time; never wait (another call is at it, or a
    -- job_history_move holds the row for a moment). The row as it is now:
    -- another call may have moved it since the read above.
    SELECT h.upto, h.next_upto, h.next_snapshot INTO v_upto, v_next, v_snap
      FROM job_history h
       FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF v_snap IS NULL THEN
        IF v_upto <= now_ms() - 1000 - v_lag THEN
            v_next := now_ms() - 1000;
            UPDATE job_history
               SET next_upto = v_next, next_snapshot = pg_current_snapshot();
        END IF;
    ELSIF NOT EXISTS (
              SELECT FROM pg_snapshot_xip(v_snap) AS x(xid)
               WHERE pg_xact_status(x.xid) IS NOT DISTINCT FROM 'in progress') THEN
        UPDATE job_history h
           SET upto = v_next,
               finished = h.finished + c.finished,
               dispatched = h.dispatched + c.dispatched,
               recalled = h.recalled + c.recalled,
               failed = h.failed + c.failed,
               next_upto = NULL,
               next_snapshot = NULL
          FROM (SELECT count(*) AS finished,
                       count(*) FILTER (WHERE j.dispatched AND NOT j.cancelled) AS dispatched,
                       count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                       count(*) FILTER (WHERE j.failed AND NOT j.cancelled
                                          AND NOT j.dispatched) AS failed
                  FROM jobs j
                 WHERE j.finished_at IS NOT NULL
                   AND j.finished_at >= v_upto
                   AND j.finished_at < v_next) AS c;
    END IF;
END
$$;

COMMENT ON FUNCTION job_history_advance() IS
'Moves job_history.upto to its next_upto, adding the jobs that finished in between '
'(by kind), '
'once every transaction running when next_upto was proposed has ended; proposes the '
'next (now_ms() less a second) once upto is ten seconds behind (pgstore.stats_lag_ms, '
'a session setting, in ms, changes that). Writes only then (at most about once per '
'ten seconds); otherwise it reads the row. Does nothing on a '
'standby, in a read-only or not READ COMMITTED transaction, or while another call '
'holds the row. Internal: store_stats calls it.';

CREATE FUNCTION job_history_move(p_finished_at bigint[], p_from text[], p_to text[])
RETURNS void
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_upto bigint;
BEGIN
    IF cardinality(p_finished_at) IS NOT DISTINCT FROM 0 OR p_finished_at IS NULL THEN
        RETURN;
    END IF;
    -- Called after the caller changed its rows: waits for a running advance and
    -- then reads its upto, so a job the advance counted (as it was before the
    -- caller's uncommitted change) is moved again; and holds the row to commit,
    -- so no advance counts the job until the change is visible.
    SELECT h.upto INTO v_upto FROM job_history h FOR UPDATE;
    UPDATE job_history h
       SET finished = h.finished - c.gone,
           dispatched = h.dispatched + c.dispatched,
           recalled = h.recalled + c.recalled,
           failed = h.failed + c.failed
      FROM (SELECT count(*) AS moved,
                   count(*) FILTER (WHERE u.t IS NULL) AS gone,
                   count(*) FILTER (WHERE u.t = 'dispatched')
                     - count(*) FILTER (WHERE u.f = 'dispatched') AS dispatched,
                   count(*) FILTER (WHERE u.t = 'recalled')
                     - count(*) FILTER (WHERE u.f = 'recalled') AS recalled,
                   count(*) FILTER (WHERE u.t = 'failed')
                     - count(*) FILTER (WHERE u.f = 'failed') AS failed
              FROM unnest(p_finished_at, p_from, p_to) AS u(at, f, t)
             WHERE u.at < v_upto) AS c
     WHERE c.moved > 0;
END
$$;

COMMENT ON FUNCTION job_history_move(bigint[], text[], text[]) IS
'Moves jobs already counted in job_history (finished_at < upto) from one kind to '
'another: p_finished_at[i] the finished_at of each (NULL: never finished, nothing to '
'move), p_from[i] its kind before (''dispatched'': not cancelled, ''recalled'', '
'''cancelled'' or ''failed''), p_to[i] its kind now (NULL, or p_to NULL: no longer '
'finished: deleted, or retried). Only those with finished_at < upto were counted; the '
'others are counted as they are by store_stats. Internal: job_purge, job_retry, '
'job_cancel (of a failed job) and job_mark_dispatched(_many) (of a cancelled one) call '
'it, after their own write.';

CREATE FUNCTION store_stats_read(p_now bigint)
RETURNS TABLE (
    now                     bigint,
    schedules               bigint,
    schedules_due           bigint,
    schedules_leased        bigint,
    schedules_done          bigint,
    oldest_due_schedule_id  text,
    oldest_due_schedule_since bigint,
    jobs_pending            bigint,
    jobs_due                bigint,
    jobs_due_expired_lease  bigint,
    jobs_leased             bigint,
    jobs_dispatched         bigint,
    jobs_recalled           bigint,
    jobs_cancelled          bigint,
    jobs_failed             bigint,
    oldest_due_job_id       text,
    oldest_due_job_at       bigint
)
LANGUAGE plpgsql STABLE
SET plan_cache_mode = force_generic_plan
SET max_parallel_workers_per_gather = 0
AS $$
-- Runs as its caller, store_stats (as the store's owner, on its pinned
-- search_path), within the caller's statement and snapshot. Planned once a
-- session (plan_cache_mode = force_generic_plan): planning this statement cost
-- several times what running it costs, at every call. Never in parallel: the
-- planner guesses the waiting jobs from the whole table's statistics (tens of
-- thousands in a long history, where a few wait), and on PostgreSQL 18 a
-- parallel count's workers cost some ms to start, more than the count. In that generic plan
-- job_history.upto is unknown (a subquery): the finished jobs' range has an
-- upper end, always true, so that the planner guesses a narrow range (0.5% of
-- the table, not the third an open range gets) and walks the index, not the
-- history. (Until pgstore_0028 the statement was store_stats' own, given an
-- earlier reading of upto as a known value and planned anew at each call, until
-- plpgsql turned to a generic plan for good, as it does when a session's first
-- plans cost as much: when they counted a history that job_history had not yet
-- passed. That generic plan walked the whole history at every call.)
BEGIN
    -- The waiting jobs' WHERE is the partial index's predicate, so that part and
    -- the oldest due job read only the jobs still waiting (the same walk
    -- job_lease makes). The history counts read job_history and the jobs
    -- finished since its upto (the finished jobs' index), each by kind: every
    -- finished job is exactly one of dispatched and not cancelled, recalled,
    -- cancelled (not dispatched) or failed (neither), so cancelled is the rest. A
    -- schedule is due and unclaimed, when not paused, from the later of due_at
    -- (its jittered occurrence, or a pending trigger) and an expired lease's end:
    -- what schedule_claim_due compares. A job of a paused queue is not due
    -- (job_lease would not take it): it counts as pending, and is never the
    -- oldest due job, so a deliberate pause raises no lag alert.
    RETURN QUERY
    SELECT p_now,
           s.total, s.due, s.leased, s.done, os.id, os.since,
           w.pending, w.due, w.due_expired, w.leased,
           f.dispatched_only + f.recalled, f.recalled,
           f.finished - f.dispatched_only - f.recalled - f.failed, f.failed,
           oj.run_id, oj.dispatch_at
      FROM (SELECT count(*) AS total,
                   count(*) FILTER (WHERE NOT sc.paused
                                      AND sc.due_at <= p_now
                                      AND (sc.lease_until IS NULL OR sc.lease_until <= p_now))
                     AS due,
                   count(*) FILTER (WHERE sc.lease_until > p_now) AS leased,
                   count(*) FILTER (WHERE sc.next_run_at IS NULL) AS done
              FROM schedules sc) AS s
     CROSS JOIN
           (SELECT count(*) FILTER (WHERE (j.dispatch_at > p_now OR j.paused)
                                      AND (j.lease_until IS NULL OR j.lease_until <= p_now))
                     AS pending,
                   count(*) FILTER (WHERE j.dispatch_at <= p_now AND NOT j.paused
                                      AND (j.lease_until IS NULL OR j.lease_until <= p_now))
                     AS due,
                   count(*) FILTER (WHERE j.dispatch_at <= p_now AND NOT j.paused
                                      AND j.lease_until <= p_now)
                     AS due_expired,
                   count(*) FILTER (WHERE j.lease_until > p_now) AS leased
              FROM (SELECT d.dispatch_at, d.lease_until,
                           coalesce((SELECT p.paused FROM queues p WHERE p.queue = 'default'),
                                    false) AS paused
                      FROM jobs d
                     WHERE NOT d.dispatched AND NOT d.cancelled AND NOT d.failed
                       AND d.queue = 'default' AND d.priority = 0
                    UNION ALL
                    SELECT q.dispatch_at, q.lease_until, coalesce(p.paused, false)
                      FROM jobs q
                      LEFT JOIN queues p ON p.queue = q.queue
                     WHERE NOT q.dispatched AND NOT q.cancelled AND NOT q.failed
                       AND (q.queue <> 'default' OR q.priority <> 0)) AS j) AS w
     CROSS JOIN
           (SELECT k.finished + d.finished AS finished,
                   k.dispatched + d.dispatched AS dispatched_only,
                   k.recalled + d.recalled AS recalled,
                   k.failed + d.failed AS failed
              FROM job_history k
             CROSS JOIN
                   (SELECT count(*) AS finished,
                           count(*) FILTER (WHERE j.dispatched AND NOT j.cancelled)
                             AS dispatched,
                           count(*) FILTER (WHERE j.dispatched AND j.cancelled) AS recalled,
                           count(*) FILTER (WHERE j.failed AND NOT j.cancelled
                                              AND NOT j.dispatched) AS failed
                      FROM jobs j
                     WHERE j.finished_at IS NOT NULL
                       AND j.finished_at >= (SELECT k2.upto FROM job_history k2)
                       AND j.finished_at <= 9223372036854775807) AS d) AS f
      LEFT JOIN LATERAL
           (SELECT sc.id, greatest(sc.due_at, sc.lease_until) AS since
              FROM schedules sc
             WHERE NOT sc.paused
               AND sc.due_at <= p_now
               AND (sc.lease_until IS NULL OR sc.lease_until <= p_now)
             ORDER BY greatest(sc.due_at, sc.lease_until), sc.id
             LIMIT 1) AS os ON true
      LEFT JOIN LATERAL
           (SELECT o.run_id, o.dispatch_at
              FROM ((SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND j.queue = 'default' AND j.priority = 0
                        AND j.dispatch_at <= p_now
                        AND (j.lease_until IS NULL OR j.lease_until <= p_now)
                        AND NOT EXISTS (SELECT FROM queues p
                                         WHERE p.queue = 'default' AND p.paused)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)
                    UNION ALL
                    (SELECT j.run_id, j.dispatch_at
                       FROM jobs j
                      WHERE NOT j.dispatched AND NOT j.cancelled AND NOT j.failed
                        AND (j.queue <> 'default' OR j.priority <> 0)
                        AND j.dispatch_at <= p_now
                        AND (j.lease_until IS NULL OR j.lease_until <= p_now)
                        AND NOT EXISTS (SELECT FROM queues p
                                         WHERE p.queue = j.queue AND p.paused)
                      ORDER BY j.dispatch_at, j.run_id
                      LIMIT 1)) AS o
             ORDER BY o.dispatch_at, o.run_id
             LIMIT 1) AS oj ON true;
END
$$;

COMMENT ON FUNCTION store_stats_read(bigint) IS
'store_stats'' one statement: its row of gauges at p_now (not NULL), the history counts '
'read from job_history and the jobs finished since its upto. Internal: store_stats '
'calls it, after moving job_history forward.';

CREATE OR REPLACE FUNCTION store_stats(p_now bigint DEFAULT NULL)
RETURNS TABLE (
    now                     bigint,
    schedules               bigint,
    schedules_due           bigint,
    schedules_leased        bigint,
    schedules_done          bigint,
    oldest_due_schedule_id  text,
    oldest_due_schedule_since bigint,
    jobs_pending            bigint,
    jobs_due                bigint,
    jobs_due_expired_lease  bigint,
    jobs_leased             bigint,
    jobs_dispatched         bigint,
    jobs_recalled           bigint,
    jobs_cancelled          bigint,
    jobs_failed             bigint,
    oldest_due_job_id       text,
    oldest_due_job_at       bigint
)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_now  bigint;
BEGIN
    v_now := CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END;
    -- VOLATILE: on a primary it first moves job_history forward (a separate
    -- statement that never waits); the gauges below are one statement, so one
    -- snapshot, which sees that move.
    PERFORM job_history_advance();
    RETURN QUERY SELECT * FROM store_stats_read(v_now);
END
$$;

COMMENT ON FUNCTION store_stats(bigint) IS
'One row of gauges at p_now (NULL: now_ms()), from one snapshot. Schedules: how many, '
'how many due and unclaimed (not paused, due_at <= now, no live lease: what '
'schedule_claim_due would take), under a live lease, '
'one-shots done (tombstones), and the one claimable longest (its id, and since when: the '
'later of due_at and an expired lease''s end). Jobs, each in exactly one state: '
'pending (waiting, no live lease, not due or its queue paused), due (waiting, due, no '
'live lease, queue not paused: what '
'job_lease would take; jobs_due_expired_lease of them after an expired lease), leased '
'(waiting, live lease), dispatched (jobs_recalled of them cancelled meanwhile), '
'cancelled (never dispatched), failed (out of attempts, not cancelled); and the oldest '
'due job (its run_id and dispatch_at). '
'The waiting counts read the two pending indexes; the history counts read job_history '
'and the jobs finished since its upto, never the rest of the history, whatever its length '
'(the schedules are scanned). On a primary, under READ '
'COMMITTED and not read-only, it first moves job_history forward '
'(job_history_advance): VOLATILE, and it may write that one row.';

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;

DROP FUNCTION job_history_forget(bigint[], boolean[]);
