-- pgstore 0027, upgrade: written by make revision from sql/; 0027_limit_changes.py says what and why.

-- The table's one change: the comment of queue_slots.slot (a retired row
-- now holds back a lane from the queue's leases, and a leaser deletes it once
-- its lease ended).
COMMENT ON COLUMN queue_slots.slot IS
'1..L: a lane, which a lease may take; negative: a retired concurrency place (-slot), '
'which only its lease''s renews write (and a leaser deletes once that lease ended); '
'each holds back one lane from the leases of the queue.';

CREATE OR REPLACE FUNCTION job_lease_take(
    p_holder text, p_now bigint, p_until bigint, p_limit integer,
    p_queues text[], p_priorities integer[]
) RETURNS SETOF jobs
LANGUAGE plpgsql
AS $$
-- Runs as its caller, job_lease or job_lease_many (as the store's owner, on
-- its pinned search_path), after they checked every argument and found, with
-- job_lease_due, the groups p_queues and p_priorities (in one order) with jobs
-- leasable now: several, or one other than the default group (whose walk is
-- theirs).
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_window  integer;
    v_left    integer := p_limit;
    v_more    boolean;
    v_rows    jobs[] := ARRAY[]::jobs[];
    v_round   jobs[];
    v_default boolean;
    v_queues  text[] := p_queues;
    v_prios   integer[] := p_priorities;
    v_limited text[];  -- the limited queues among the groups
    v_limits  jsonb;   -- NULL: none
    v_caps    jsonb;
    v_one     boolean := false;
BEGIN
    -- Queue limits (sql/24_queue_limits.sql): the limited queues among the
    -- groups (one probe of queues a queue); lock their lanes first, one row a
    -- job, as many as each has jobs leasable now (up to p_limit), and lease at
    -- most as many of each one's jobs (its cap); a queue with none free drops
    -- out, like a paused one. Its leases take the rounds below, which write
    -- them into the lanes at the end.
    SELECT array_agg(q.queue) INTO v_limited
      FROM queues q
     WHERE q.queue = ANY (v_queues)
       AND (q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL);
    IF v_limited IS NOT NULL THEN
        SELECT queue_limits_reserve(array_agg(w.queue), array_agg(w.want), p_now)
          INTO v_limits
          FROM queue_limits_wants(v_queues, v_prios, v_limited, p_now, p_limit) w;
        v_caps := queue_limits_caps(v_limits, '{}');
        SELECT array_agg(g.queue), array_agg(g.priority)
          INTO v_queues, v_prios
          FROM unnest(v_queues, v_prios) AS g(queue, priority)
         WHERE coalesce((v_caps ->> g.queue)::integer, 1) > 0;
        IF v_queues IS NULL THEN
            RETURN;
        END IF;
        -- One queue only (one group, or the priorities of one): its cap is the
        -- limit of the lease; else each limited queue's first cap rows are its
        -- candidates.
        v_one := (SELECT count(DISTINCT g.queue) = 1 FROM unnest(v_queues) AS g(queue));
    END IF;
    v_default := EXISTS (SELECT FROM unnest(v_queues, v_prios) AS g(queue, priority)
                         WHERE g.queue = 'default' AND g.priority = 0);

    -- Every read of a group below states the predicate of the index that holds
    -- it, so it walks that index and no other (never a paused queue's backlog).
    --
    -- One group with jobs leasable now: its due head in lease order, locked as
    -- it is walked, skipping rows concurrent leasers hold locked; the UPDATE
    -- reaches them through the primary key. Only the branch the CASE takes runs
    -- (InitPlans run when first read). job_fences and store_epoch are read by
    -- this statement (InitPlans, once), never by an earlier one, and a job out
    -- of attempts is failed by this UPDATE instead of leased (it counts against
    -- p_limit and is left out of the answer).
    -- (Without limits v_queues and v_prios are p_queues and p_priorities.)
    IF cardinality(v_queues) = 1 AND NOT v_default AND v_limits IS NULL THEN
        RETURN QUERY
        WITH leased AS (
            UPDATE jobs j
               SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
                   lease_until = CASE WHEN j.attempts < j.max_attempts THEN p_until END,
                   lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                         THEN greatest(j.lease_sequence + 1,
                                                       (SELECT token_floor_at(
                                                                   (SELECT e.epoch
                                                                      FROM store_epoch e))),
                                                       (SELECT f.lease_sequence + 1
                                                          FROM job_fences f))
                                         ELSE j.lease_sequence END,
                   attempts = CASE WHEN j.attempts < j.max_attempts
                                   THEN j.attempts + 1 ELSE j.attempts END,
                   failed = j.attempts >= j.max_attempts,
                   finished_at = CASE WHEN j.attempts < j.max_attempts
                                      THEN j.finished_at ELSE now_ms() END,
                   last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                     ELSE format('out of attempts: leased %s times '
                                                 '(max_attempts %s), the last lease '
                                                 'expired without a release',
                                                 j.attempts, j.max_attempts) END
             WHERE j.run_id = ANY (ARRAY(
                       SELECT c.run_id
                         FROM jobs c
                        WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                          AND (c.queue <> 'default' OR c.priority <> 0)
                          AND c.queue = p_queues[1] AND c.priority = p_priorities[1]
                          AND c.dispatch_at <= p_now
                          AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                        ORDER BY c.dispatch_at, c.run_id
                        LIMIT p_limit
                          FOR UPDATE SKIP LOCKED))
            RETURNING j.*)
        SELECT l.* FROM leased l WHERE NOT l.failed ORDER BY l.dispatch_at, l.run_id;
        RETURN;
    END IF;

    -- Several groups with jobs leasable now: the due head of each (tuple ids,
    -- unlocked), then those tuples (one heap page each, no index descent) in
    -- lease order, locked up to v_left: LockRows sits between the sort and the
    -- limit, so it locks in order and no more than it returns, and rechecks
    -- each row it locks in its newest version. The recheck is one opaque
    -- condition (IS TRUE): bare, it would have the planner walk the queues'
    -- whole due backlog in a pending index instead. job_lease's rules for each
    -- job, as above.
    --
    -- Each group's due head is read p_limit + 16 deep, so 16 concurrent leasers
    -- find rows the others have not locked. A round that leases fewer than it
    -- may while some head was cut short reads four times deeper (the rows it
    -- leased are live leases by then, and skipped).
    v_window := p_limit + 16;
    LOOP
        WITH heads AS MATERIALIZED (
            SELECT w.tid, 'default'::text AS queue, w.priority, w.dispatch_at, w.run_id,
                   w.rn, w.n
              FROM (SELECT x.*, row_number() OVER (ORDER BY x.dispatch_at, x.run_id) AS rn,
                           count(*) OVER () AS n
                      FROM (SELECT c.ctid AS tid, c.priority, c.dispatch_at, c.run_id
                              FROM jobs c
                             WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                               AND c.queue = 'default' AND c.priority = 0
                               AND c.dispatch_at <= p_now
                               AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                             ORDER BY c.dispatch_at, c.run_id
                             LIMIT v_window) x
                     WHERE v_default) w
            UNION ALL
            SELECT w.tid, g.queue, w.priority, w.dispatch_at, w.run_id, w.rn, w.n
              FROM unnest(v_queues, v_prios) AS g(queue, priority)
             CROSS JOIN LATERAL (
                   SELECT x.*, row_number() OVER (ORDER BY x.dispatch_at, x.run_id) AS rn,
                          count(*) OVER () AS n
                     FROM (SELECT c.ctid AS tid, c.priority, c.dispatch_at, c.run_id
                             FROM jobs c
                            WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                              AND (c.queue <> 'default' OR c.priority <> 0)
                              AND c.queue = g.queue AND c.priority = g.priority
                              AND c.dispatch_at <= p_now
                              AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                            ORDER BY c.dispatch_at, c.run_id
                            LIMIT v_window) x) w
             WHERE g.queue <> 'default' OR g.priority <> 0),
        -- A head cut short (v_window rows read) may hide rows that come before
        -- another group's in lease order: only the rows up to the earliest last
        -- row of a cut head are merged, so a lease never skips an unlocked row
        -- it should have taken first.
        -- A limited queue's first cap rows in lease order, over its groups (one
        -- queue only: all of them, and its cap limits the lease below). Without
        -- limits the heads as they are: the other branch reads no row.
        capped AS (
            SELECT h.tid, h.priority, h.dispatch_at, h.run_id
              FROM heads h
             WHERE v_limits IS NULL
            UNION ALL
            SELECT c.tid, c.priority, c.dispatch_at, c.run_id
              FROM (SELECT h.*,
                           row_number() OVER (PARTITION BY h.queue
                                              ORDER BY h.priority DESC, h.dispatch_at,
                                                       h.run_id) AS qn
                      FROM heads h
                     WHERE v_limits IS NOT NULL) c
             WHERE v_one OR c.qn <= coalesce((v_caps ->> c.queue)::integer, c.qn)),
        safe AS (
            SELECT h.tid
              FROM capped h
             WHERE NOT EXISTS (
                       SELECT FROM heads l
                        WHERE l.n >= v_window AND l.rn = l.n
                          AND (-l.priority, l.dispatch_at, l.run_id)
                              < (-h.priority, h.dispatch_at, h.run_id))),
        leased AS (
            UPDATE jobs j
               SET lease_holder = CASE WHEN j.attempts < j.max_attempts THEN p_holder END,
                   lease_until = CASE WHEN j.attempts < j.max_attempts THEN p_until END,
                   lease_sequence = CASE WHEN j.attempts < j.max_attempts
                                         THEN greatest(j.lease_sequence + 1,
                                                       (SELECT token_floor_at(
                                                                   (SELECT e.epoch
                                                                      FROM store_epoch e))),
                                                       (SELECT f.lease_sequence + 1
                                                          FROM job_fences f))
                                         ELSE j.lease_sequence END,
                   attempts = CASE WHEN j.attempts < j.max_attempts
                                   THEN j.attempts + 1 ELSE j.attempts END,
                   failed = j.attempts >= j.max_attempts,
                   finished_at = CASE WHEN j.attempts < j.max_attempts
                                      THEN j.finished_at ELSE now_ms() END,
                   last_error = CASE WHEN j.attempts < j.max_attempts THEN j.last_error
                                     ELSE format('out of attempts: leased %s times '
                                                 '(max_attempts %s), the last lease '
                                                 'expired without a release',
                                                 j.attempts, j.max_attempts) END
             WHERE j.run_id = ANY (ARRAY(
                       SELECT c.run_id
                         FROM jobs c
                        WHERE c.ctid = ANY (ARRAY(SELECT f.tid FROM safe f))
                          AND (NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                               AND c.dispatch_at <= p_now
                               AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                               AND (c.queue, c.priority) IN (
                                       SELECT * FROM unnest(v_queues, v_prios)))
                              IS TRUE
                        ORDER BY c.priority DESC, c.dispatch_at, c.run_id
                        LIMIT CASE WHEN v_one
                                   THEN least(v_left, (v_caps ->> v_queues[1])::integer)
                                   ELSE v_left END
                          FOR UPDATE SKIP LOCKED))
            RETURNING j AS job)
        SELECT coalesce(array_agg(l.job), ARRAY[]::jobs[]),
               coalesce((SELECT bool_or(h.n >= v_window) FROM heads h), false)
          INTO v_round, v_more
          FROM leased l;

        v_rows := v_rows || v_round;
        v_left := v_left - cardinality(v_round);
        IF v_limits IS NOT NULL THEN
            v_caps := queue_limits_caps(
                v_limits, ARRAY(SELECT r.queue FROM unnest(v_rows) r WHERE NOT r.failed));
            -- A job of a limited queue failed instead of leased was one of the
            -- queue's capped candidates and took none of its lanes: another
            -- round, for the queue's next jobs, as the next single lease would
            -- take them.
            v_more := v_more OR EXISTS (
                          SELECT FROM unnest(v_round) r
                           WHERE r.failed AND (v_caps ->> r.queue)::integer > 0);
        END IF;
        EXIT WHEN v_left <= 0 OR NOT v_more;
        v_window := v_window * 4;
    END LOOP;
    IF v_limits IS NOT NULL THEN
        -- A job failed instead of leased took no row.
        PERFORM queue_limits_fill(v_limits, array_agg(r.queue), array_agg(r.run_id),
                                  array_agg(r.lease_sequence), p_now, p_until)
           FROM unnest(v_rows) r
          WHERE NOT r.failed;
    END IF;

    RETURN QUERY
    SELECT r.* FROM unnest(v_rows) r
     WHERE NOT r.failed
     ORDER BY r.priority DESC, r.dispatch_at, r.run_id;
END
$$;

CREATE OR REPLACE FUNCTION queue_slots_layout(p_queue text, p_concurrency integer, p_rate integer)
RETURNS void
LANGUAGE plpgsql
AS $$
-- Runs as its caller, queue_set_concurrency or queue_set_rate, which hold the
-- queue's row lock (two changes of one queue take turns) and pass its new
-- limits.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_lanes integer := least(p_concurrency, p_rate);  -- least() passes over a NULL
    v_old   integer;
    v_rows  queue_slots[];
BEGIN
    -- Every row of the queue, locked in slot order (as the renews lock them),
    -- waiting for the leases and renews that hold them; then read by a later
    -- statement, whose snapshot sees what they committed.
    PERFORM FROM queue_slots s WHERE s.queue = p_queue ORDER BY s.slot FOR UPDATE;
    SELECT array_agg(s ORDER BY s.slot) INTO v_rows FROM queue_slots s WHERE s.queue = p_queue;
    DELETE FROM queue_slots s WHERE s.queue = p_queue;
    v_old := (SELECT count(*) FROM unnest(v_rows) r WHERE r.slot > 0);
    IF v_lanes IS NULL THEN
        RETURN;
    END IF;

    -- Each place by its number: the concurrency places that served a lease
    -- (lanes and retired rows), the rate places that served one.
    INSERT INTO queue_slots (queue, slot, run_ids, lease_sequences, lease_untils, taken_ats)
    WITH places AS (
        SELECT CASE WHEN r.slot > 0 THEN (k - 1) * v_old + r.slot ELSE -r.slot END AS place,
               r.run_ids[k] AS run_id, r.lease_sequences[k] AS lease_sequence,
               r.lease_untils[k] AS lease_until
          FROM unnest(v_rows) r
         CROSS JOIN LATERAL generate_subscripts(r.run_ids, 1) AS k
         WHERE r.run_ids[k] IS NOT NULL AND p_concurrency IS NOT NULL),
    stamped AS (
        SELECT (k - 1) * v_old + r.slot AS place, r.taken_ats[k] AS taken_at
          FROM unnest(v_rows) r
         CROSS JOIN LATERAL generate_subscripts(r.taken_ats, 1) AS k
         WHERE r.slot > 0 AND r.taken_ats[k] IS NOT NULL AND p_rate IS NOT NULL),
    -- The newest p_rate uses: a lowered rate limit forgets only uses older than
    -- every one it keeps, so a lease that a kept place allows (its use a period
    -- old) finds each forgotten one out of its window too. Those kept keep
    -- their place up to p_rate; those above it take the free places below, in
    -- order.
    kept AS (
        SELECT t.place, t.taken_at FROM stamped t ORDER BY t.taken_at DESC, t.place LIMIT p_rate),
    stamps AS (
        SELECT k.place, k.taken_at FROM kept k WHERE k.place <= p_rate
        UNION ALL
        SELECT h.place, m.taken_at
          FROM (SELECT k.taken_at, row_number() OVER (ORDER BY k.place) AS n
                  FROM kept k WHERE k.place > p_rate) m
          JOIN (SELECT g AS place, row_number() OVER (ORDER BY g) AS n
                  FROM generate_series(1, p_rate) AS g
                 WHERE g NOT IN (SELECT k.place FROM kept k)) h ON h.n = m.n)
    -- The lanes: each place up to the new limits keeps what it held.
    SELECT p_queue, i,
           CASE WHEN p_concurrency IS NOT NULL THEN ARRAY(
               SELECT c.run_id FROM generate_series(i, p_concurrency, v_lanes) AS g
                 LEFT JOIN places c ON c.place = g ORDER BY g) END,
           CASE WHEN p_concurrency IS NOT NULL THEN ARRAY(
               SELECT c.lease_sequence FROM generate_series(i, p_concurrency, v_lanes) AS g
                 LEFT JOIN places c ON c.place = g ORDER BY g) END,
           CASE WHEN p_concurrency IS NOT NULL THEN ARRAY(
               SELECT c.lease_until FROM generate_series(i, p_concurrency, v_lanes) AS g
                 LEFT JOIN places c ON c.place = g ORDER BY g) END,
           CASE WHEN p_rate IS NOT NULL THEN ARRAY(
               SELECT t.taken_at FROM generate_series(i, p_rate, v_lanes) AS g
                 LEFT JOIN stamps t ON t.place = g ORDER BY g) END
      FROM generate_series(1, v_lanes) AS i
    UNION ALL
    -- Concurrency places above a lowered limit whose lease may live: retired.
    -- No clock decides it here (a NULL now: lease_until alone frees nothing),
    -- so a holder whose p_now runs behind the database clock keeps its place.
    SELECT p_queue, -c.place, ARRAY[c.run_id], ARRAY[c.lease_sequence],
           ARRAY[c.lease_until], NULL
      FROM places c
     WHERE c.place > p_concurrency
       AND queue_slot_free(c.run_id, c.lease_sequence, c.lease_until, NULL) IS NOT TRUE;
END
$$;

COMMENT ON FUNCTION queue_slots_layout(text, integer, integer) IS
'Lays the rows of p_queue in queue_slots out again for the limits p_concurrency and '
'p_rate (NULL: none): locks them all (waiting for whoever holds them), deletes them and '
'inserts least(p_concurrency, p_rate) lanes, each place up to the new limits holding '
'what it held (the newest p_rate uses of rate places, those above p_rate moved into the '
'free places below), and a retired row for each concurrency place above p_concurrency whose '
'lease may still live (only the job''s evidence says it ended). No rows when both are '
'NULL.';

CREATE FUNCTION queue_slots_sweep(p_queue text, p_now bigint) RETURNS void
LANGUAGE plpgsql
AS $$
-- Runs as its caller, queue_limits_reserve or queue_limits_keep, before they
-- look for a free place of p_queue: each retired place left stands for a
-- lease over a lowered limit that may live (their reads of the lanes count
-- them, in the snapshot that shows the lanes).
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    -- The retired places whose lease ended at p_now go, under their row lock:
    -- a renew of one of those leases (its holder's clock behind p_now) then
    -- finds no place, as it would had a leaser taken a lane place of it. One
    -- that a renew holds locked stays: its lease lives.
    IF EXISTS (SELECT FROM queue_slots s WHERE s.queue = p_queue AND s.slot < 0) THEN
        DELETE FROM queue_slots s
         WHERE (s.queue, s.slot) IN (
                   SELECT r.queue, r.slot
                     FROM queue_slots r
                    WHERE r.queue = p_queue AND r.slot < 0
                      AND queue_slot_free(r.run_ids[1], r.lease_sequences[1],
                                          r.lease_untils[1], p_now)
                      FOR UPDATE SKIP LOCKED);
    END IF;
END
$$;

COMMENT ON FUNCTION queue_slots_sweep(text, bigint) IS
'Deletes the retired concurrency places of p_queue (queue_slots rows with slot < 0) '
'whose lease ended at p_now (queue_slot_free), those it can lock: each one left holds '
'back a lane from the leases of the queue, and while one is left a renew without a '
'place takes none.';

CREATE OR REPLACE FUNCTION queue_limits_reserve(p_queues text[], p_wants integer[], p_now bigint)
RETURNS jsonb
LANGUAGE plpgsql
AS $$
-- Runs as its caller, job_lease_take (as the store's owner, on its pinned
-- search_path), for the limited queues among the groups it leases from.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_queue text;
    v_want  integer;
    v_lanes integer[];
    v_cpos  integer[];
    v_rpos  integer[];
    v_held  integer;  -- the queue's retired places
    v_out   jsonb := '{}'::jsonb;
BEGIN
    FOR v_queue, v_want IN
        SELECT q.queue, w.want
          FROM unnest(p_queues, p_wants) AS w(queue, want)
          JOIN queues q ON q.queue = w.queue
         WHERE q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL
         ORDER BY q.queue
    LOOP
        PERFORM queue_slots_sweep(v_queue, p_now);
        -- One lane a job: each lane has a free place of each kind the queue
        -- limits (its arrays say which: NULL, no such limit). And one lane
        -- more for each retired place left (its lease may live), counted in
        -- the same snapshot as the lanes: those lanes take no lease, and
        -- queue_limits_fill clears the place each was found to have free. The period is
        -- read by this statement, in the snapshot that shows these lanes. The
        -- rules of queue_lane_free (queue_slot_free) and queue_lane_usable are
        -- written out here, as subqueries of the lane's columns: re-checked on
        -- the newest version of a lane another leaser changed (EvalPlanQual),
        -- and cheaper than a call of a SQL function with a subquery (never
        -- inlined) twice a lane. A lane of one place of a kind needs no second
        -- look for which one it is.
        SELECT coalesce(array_agg(l.slot ORDER BY l.slot), '{}'),
               array_agg(l.cpos ORDER BY l.slot), array_agg(l.rpos ORDER BY l.slot),
               (SELECT count(*) FROM queue_slots r WHERE r.queue = v_queue AND r.slot < 0)
          INTO v_lanes, v_cpos, v_rpos, v_held
          FROM (SELECT s.slot,
                       CASE WHEN cardinality(s.lease_untils) = 1 THEN 1
                            ELSE queue_lane_free(s.run_ids, s.lease_sequences,
                                                 s.lease_untils, p_now) END AS cpos,
                       CASE WHEN cardinality(s.taken_ats) = 1 THEN 1
                            ELSE queue_lane_usable(s.taken_ats, q.rate_period_ms,
                                                   p_now) END AS rpos
                  FROM queue_slots s
                  JOIN queues q ON q.queue = s.queue
                 WHERE s.queue = v_queue AND s.slot > 0
                   AND CASE WHEN s.run_ids IS NULL THEN true
                            WHEN cardinality(s.lease_untils) = 1
                            THEN s.lease_untils[1] IS NULL
                                 OR s.lease_untils[1] <= p_now
                                 OR EXISTS (
                                        SELECT FROM jobs j
                                         WHERE j.run_id = s.run_ids[1]
                                           AND (j.lease_sequence > s.lease_sequences[1]
                                                OR (j.lease_sequence = s.lease_sequences[1]
                                                    AND (j.dispatched OR j.failed
                                                         OR j.lease_holder IS NULL))))
                            ELSE EXISTS (
                                     SELECT
                                       FROM generate_subscripts(s.lease_untils, 1) AS k
                                      WHERE s.lease_untils[k] IS NULL
                                         OR s.lease_untils[k] <= p_now
                                         OR EXISTS (
                                                SELECT FROM jobs j
                                                 WHERE j.run_id = s.run_ids[k]
                                                   AND (j.lease_sequence > s.lease_sequences[k]
                                                        OR (j.lease_sequence
                                                                = s.lease_sequences[k]
                                                            AND (j.dispatched OR j.failed
                                                                 OR j.lease_holder IS NULL))))
                                 ) END
                   AND CASE WHEN s.taken_ats IS NULL THEN true
                            WHEN cardinality(s.taken_ats) = 1
                            THEN s.taken_ats[1] IS NULL
                                 OR s.taken_ats[1]::numeric
                                    <= p_now::numeric - q.rate_period_ms
                            ELSE EXISTS (
                                     SELECT FROM unnest(s.taken_ats) AS t(taken_at)
                                      WHERE t.taken_at IS NULL
                                         OR t.taken_at::numeric
                                            <= p_now::numeric - q.rate_period_ms) END
                 ORDER BY s.slot
                 LIMIT v_want + (SELECT count(*) FROM queue_slots r
                                  WHERE r.queue = v_queue AND r.slot < 0)
                   FOR UPDATE OF s SKIP LOCKED) l;
        v_out := v_out || jsonb_build_object(
            v_queue, jsonb_build_object('cap', greatest(cardinality(v_lanes) - v_held, 0),
                                        'lanes', v_lanes, 'cpos', v_cpos, 'rpos', v_rpos));
    END LOOP;
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION queue_limits_reserve(text[], integer[], bigint) IS
'For each queue p_queues[i] that has a limit: locks (FOR UPDATE SKIP LOCKED) up to '
'p_wants[i] of its lanes usable at p_now (a free concurrency place, queue_lane_free, and '
'a usable rate place, queue_lane_usable, of the limits it has), one row a job, and '
'answers {queue: {cap, lanes, cpos, rpos}}: the lease may take at most cap of the '
'queue''s jobs, and queue_limits_fill writes them into those places; one lane more for '
'each retired place left after queue_slots_sweep, past the cap (queue_limits_fill clears '
'its free place), and the cap that much lower. Queues without '
'limits are left out; ''{}'' when none has one. Lanes it locks and does not fill are let '
'go at commit, unwritten.';

CREATE OR REPLACE FUNCTION queue_limits_fill(
    p_limits jsonb, p_queues text[], p_run_ids text[], p_sequences bigint[],
    p_now bigint, p_until bigint
) RETURNS void
LANGUAGE plpgsql
AS $$
-- Runs as its caller, job_lease_take, in the transaction that reserved the
-- lanes (it holds their locks) and took the leases (p_queues[i], p_run_ids[i],
-- p_sequences[i]).
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    -- The i-th leased job of a queue (by run_id) gets the queue's i-th
    -- reserved lane, and there the places queue_limits_reserve found free.
    -- More leased jobs than reserved lanes would be a bug of the caller's: an
    -- error, never a lease over the limit.
    IF EXISTS (
           SELECT FROM (SELECT j.queue, count(*) AS n
                          FROM unnest(p_queues) AS j(queue)
                         WHERE p_limits ? j.queue
                         GROUP BY j.queue) c
            WHERE c.n > (p_limits -> c.queue ->> 'cap')::integer) THEN
        RAISE EXCEPTION 'pgstore: a lease took more jobs of a limited queue than it reserved';
    END IF;
    UPDATE queue_slots s
       SET run_ids = CASE WHEN p.cpos IS NULL THEN s.run_ids
                          ELSE s.run_ids[1:p.cpos - 1] || p.run_id || s.run_ids[p.cpos + 1:] END,
           lease_sequences = CASE WHEN p.cpos IS NULL THEN s.lease_sequences
                                  ELSE s.lease_sequences[1:p.cpos - 1] || p.lease_sequence
                                       || s.lease_sequences[p.cpos + 1:] END,
           lease_untils = CASE WHEN p.cpos IS NULL THEN s.lease_untils
                               ELSE s.lease_untils[1:p.cpos - 1] || p_until
                                    || s.lease_untils[p.cpos + 1:] END,
           taken_ats = CASE WHEN p.rpos IS NULL THEN s.taken_ats
                            ELSE s.taken_ats[1:p.rpos - 1] || p_now
                                 || s.taken_ats[p.rpos + 1:] END
      FROM (SELECT l.queue, l.run_id, l.lease_sequence,
                   (p_limits -> l.queue -> 'lanes' ->> l.i::integer)::integer AS lane,
                   (p_limits -> l.queue -> 'cpos' ->> l.i::integer)::integer AS cpos,
                   (p_limits -> l.queue -> 'rpos' ->> l.i::integer)::integer AS rpos
              FROM (SELECT j.queue, j.run_id, j.lease_sequence,
                           row_number() OVER (PARTITION BY j.queue ORDER BY j.run_id) - 1 AS i
                      FROM unnest(p_queues, p_run_ids, p_sequences)
                           AS j(queue, run_id, lease_sequence)
                     WHERE p_limits ? j.queue) l) p
     WHERE s.queue = p.queue AND s.slot = p.lane;
    -- The lanes past the cap stand for the retired places' leases: the place
    -- each was found to have free is cleared, so that it is free for every
    -- clock (a renew of a lease there whose clock runs behind this p_now then
    -- finds it gone, as it would had a lease taken it).
    UPDATE queue_slots s
       SET run_ids = s.run_ids[1:e.cpos - 1] || NULL::text || s.run_ids[e.cpos + 1:],
           lease_sequences = s.lease_sequences[1:e.cpos - 1] || NULL::bigint
                             || s.lease_sequences[e.cpos + 1:],
           lease_untils = s.lease_untils[1:e.cpos - 1] || NULL::bigint
                          || s.lease_untils[e.cpos + 1:]
      FROM (SELECT q.key AS queue, l.lane::integer AS lane, c.cpos::integer AS cpos
              FROM jsonb_each(p_limits) q
             CROSS JOIN LATERAL jsonb_array_elements_text(q.value -> 'lanes')
                   WITH ORDINALITY AS l(lane, n)
              JOIN LATERAL jsonb_array_elements_text(   -- JSON null: no lanes
                       CASE WHEN jsonb_typeof(q.value -> 'cpos') = 'array'
                            THEN q.value -> 'cpos' END)
                   WITH ORDINALITY AS c(cpos, n) ON c.n = l.n
             WHERE l.n > (q.value ->> 'cap')::integer AND c.cpos IS NOT NULL) e
     WHERE s.queue = e.queue AND s.slot = e.lane;
END
$$;

COMMENT ON FUNCTION queue_limits_fill(jsonb, text[], text[], bigint[], bigint, bigint) IS
'Writes the leases (p_queues[i], p_run_ids[i], p_sequences[i]) into the lanes '
'queue_limits_reserve answered in p_limits, one lane a lease: its free concurrency place '
'gets the lease (run_id, lease_sequence) and lease_until p_until, its usable rate place '
'taken_at p_now; in each lane past a queue''s cap (one a retired place), the free '
'concurrency place it was found to have is cleared. Raises (P0001) rather than record '
'more leases of a queue than its cap.';

CREATE OR REPLACE FUNCTION queue_limits_keep(
    p_queues text[], p_run_ids text[], p_sequences bigint[], p_now bigint, p_until bigint
) RETURNS text[]
LANGUAGE plpgsql
AS $$
-- Runs as its caller, job_renew or job_renew_many, after it extended the
-- leases (it holds their jobs' row locks), for the jobs of queues with a
-- concurrency limit.
-- @plpgsql_check_options: performance_warnings = false
DECLARE
    v_kept  text[] := ARRAY[]::text[];
    v_lost  text[] := ARRAY[]::text[];
    v_job   record;
    v_again boolean;
BEGIN
    -- The place each lease holds, extended. The lanes are locked in slot
    -- order first (a lane holds several leases when the concurrency limit is
    -- the larger: two renews never wait on each other in a circle). The row
    -- lock orders this with a leaser that found the place free (its
    -- lease_until passed on that leaser's clock): either it took the place
    -- first (this finds another lease there) or it sees the extended
    -- lease_until. Another pass, with a new snapshot, for the leases not found
    -- while a row that held one in this pass's snapshot was gone or changed
    -- once locked: a change of the limits replaced the rows it waited for (and
    -- the next change may replace the new ones too before this locks them), or
    -- a leaser took the place (the next pass finds it no more).
    LOOP
        WITH leases AS (
            SELECT u.queue, u.run_id, u.seq
              FROM unnest(p_queues, p_run_ids, p_sequences) AS u(queue, run_id, seq)
             WHERE NOT u.run_id = ANY (v_kept)),
        seen AS (
            SELECT count(*) AS n
              FROM queue_slots s
             WHERE s.run_ids && ARRAY(SELECT l.run_id FROM leases l)
               AND EXISTS (SELECT FROM leases l
                            WHERE l.queue = s.queue
                              AND (l.run_id, l.seq) IN (
                                      SELECT * FROM unnest(s.run_ids, s.lease_sequences)))),
        locked AS (
            SELECT s.queue, s.slot
              FROM queue_slots s
             WHERE s.run_ids && ARRAY(SELECT l.run_id FROM leases l)
               AND EXISTS (SELECT FROM leases l
                            WHERE l.queue = s.queue
                              AND (l.run_id, l.seq) IN (
                                      SELECT * FROM unnest(s.run_ids, s.lease_sequences)))
             ORDER BY s.queue, s.slot
               FOR UPDATE),
        kept AS (
            UPDATE queue_slots s
               SET lease_untils = ARRAY(
                       SELECT CASE WHEN EXISTS (SELECT FROM leases l
                                                 WHERE l.queue = s.queue
                                                   AND l.run_id = s.run_ids[k]
                                                   AND l.seq = s.lease_sequences[k])
                                   THEN greatest(s.lease_untils[k], p_until)
                                   ELSE s.lease_untils[k] END
                         FROM generate_subscripts(s.lease_untils, 1) AS k
                        ORDER BY k)
              FROM locked o
             WHERE s.queue = o.queue AND s.slot = o.slot
            RETURNING s.queue, s.run_ids, s.lease_sequences)
        SELECT v_kept || coalesce(
                   (SELECT array_agg(l.run_id)
                      FROM kept k
                     CROSS JOIN LATERAL unnest(k.run_ids, k.lease_sequences) AS r(run_id, seq)
                      JOIN leases l ON l.queue = k.queue AND l.run_id = r.run_id
                                   AND l.seq = r.seq), '{}'),
               (SELECT n FROM seen) > (SELECT count(*) FROM locked)
          INTO v_kept, v_again;
        EXIT WHEN p_run_ids <@ v_kept OR NOT v_again;
    END LOOP;

    -- A lease without a place (taken before the limit was set, or its place
    -- taken by a leaser whose clock ran past its lease_until) takes a free one
    -- in a lane (its rate places untouched: a renew is no new lease), none
    -- while a retired place is left (as a lease), or is lost. A lease of a
    -- queue that has no concurrency limit now (a change lifted it while this
    -- renew waited for the lanes) needs no place: it is kept.
    FOR v_job IN
        SELECT u.queue, u.run_id, u.seq
          FROM unnest(p_queues, p_run_ids, p_sequences) AS u(queue, run_id, seq)
         WHERE NOT u.run_id = ANY (v_kept)
           AND EXISTS (SELECT FROM queues q
                        WHERE q.queue = u.queue AND q.concurrency_limit IS NOT NULL)
         ORDER BY u.run_id
    LOOP
        PERFORM queue_slots_sweep(v_job.queue, p_now);
        UPDATE queue_slots s
           SET run_ids = s.run_ids[1:f.pos - 1] || v_job.run_id || s.run_ids[f.pos + 1:],
               lease_sequences = s.lease_sequences[1:f.pos - 1] || v_job.seq
                                 || s.lease_sequences[f.pos + 1:],
               lease_untils = s.lease_untils[1:f.pos - 1] || p_until
                              || s.lease_untils[f.pos + 1:]
          FROM (SELECT f.queue, f.slot,
                       queue_lane_free(f.run_ids, f.lease_sequences, f.lease_untils, p_now)
                           AS pos
                  FROM queue_slots f
                 WHERE f.queue = v_job.queue AND f.slot > 0 AND f.run_ids IS NOT NULL
                   AND NOT EXISTS (SELECT FROM queue_slots r
                                    WHERE r.queue = v_job.queue AND r.slot < 0)
                   AND queue_lane_free(f.run_ids, f.lease_sequences, f.lease_untils, p_now)
                       IS NOT NULL
                 ORDER BY f.slot
                 LIMIT 1
                   FOR UPDATE SKIP LOCKED) f
         WHERE s.queue = f.queue AND s.slot = f.slot;
        IF NOT FOUND THEN
            v_lost := v_lost || v_job.run_id;
        END IF;
    END LOOP;
    RETURN v_lost;
END
$$;

COMMENT ON FUNCTION queue_limits_keep(text[], text[], bigint[], bigint, bigint) IS
'For the renewed leases (p_queues[i], p_run_ids[i], p_sequences[i]) of queues with a '
'concurrency limit: extends the concurrency place each holds (in a lane or retired) to '
'p_until, or gives one that holds none a free place in a lane (none while the queue has '
'a retired place after queue_slots_sweep); answers the run_ids of those that found none '
'(the queue is full: their renew must fail and their lease end). A lease of a queue '
'that has no concurrency limit by then needs no place.';

DO $revoke$ BEGIN
    EXECUTE format('REVOKE ALL ON ALL ROUTINES IN SCHEMA %I FROM PUBLIC', current_schema());
END $revoke$;
