-- pgstore: the queue limits (docs/queues.md, "Limits").
--
-- A concurrency limit (at most C live leases of a queue's jobs at once) and a
-- rate limit (at most R leases of them in any window of one period), kept so
-- that they hold across hosts and languages with ONE row lock a leased job,
-- whichever limits the queue has, and no counter that every leaser would queue
-- on.
--
-- The places. A concurrency limit of C is C places (numbered 1..C), each
-- holding at most one live lease; a rate limit of R is R places, each serving
-- at most one lease in any window of one period. They are kept in the queue's
-- rows of queue_slots, its lanes: with L the smaller of the limits it has, lane
-- i (slot i, 1..L) holds the concurrency places i, i + L, i + 2L, ... up to C
-- (the arrays run_ids, lease_sequences and lease_untils; element k is place
-- (k - 1) * L + i) and the rate places i, i + L, ... up to R (taken_ats). As L
-- is the smaller limit, one of the two kinds is a single place in every lane:
-- a lane serves at most one new lease at a time, and a lease of a job in a
-- limited queue locks exactly one row, its lane, for both limits.
--
-- * a lease of a job in a limited queue first locks usable lanes (FOR UPDATE
--   SKIP LOCKED: a leaser never waits on another): lanes with a free place of
--   each kind the queue limits, as many as it has jobs leasable now; it leases
--   at most as many of the queue's jobs as it locked lanes, and writes each
--   leased job into the first free place of each kind of its lane, in the same
--   transaction;
-- * a concurrency place is busy while its own lease_until lies ahead, unless
--   the jobs row shows that this very lease (its run_id and lease_sequence)
--   ended: dispatched, released, failed, or leased again. Only that positive
--   evidence frees it early, never the absence of a row or of a lease, because
--   under READ COMMITTED a leaser re-checks a lane that another leaser just
--   took (EvalPlanQual) with its own, older snapshot of jobs, in which that
--   lease may not exist yet. So mark, release and cancel write nothing here;
--   job_renew and job_renew_many extend the place (the only writers besides
--   the lease and the setters), which a leaser then sees in the row itself;
-- * a rate place is usable when its taken_at is at least one period old.
--
-- Why both hold: every place lies in exactly one lane, and a place is written
-- only by a transaction that holds its lane's row lock, after it found the
-- place free (or usable) in the newest version of that row. So each
-- concurrency place holds at most one live lease and each rate place serves at
-- most one lease a period, as when each place was a row of its own
-- (pgstore_0024): C places hold at most C live leases, R places serve at most R
-- a period. What the lanes give up: a lease needs both kinds in ONE lane, so
-- with both limits it finds none when every lane with a free concurrency place
-- has its rate places used up (or the other way round), though the queue has
-- a free place of each kind in different lanes. With one limit, nothing: a lane
-- is a place.
--
-- A change of the limits lays the lanes out again (queue_slots_layout): it
-- locks every row of the queue (waiting for the leases and renews that hold
-- them), deletes them and inserts the new lanes; each place up to the new limit
-- keeps what it held, and a concurrency place above a lowered limit that may
-- still serve a live lease (no clock decides it) is kept as a retired row
-- (slot = -place) that no lease takes and its lease's renews keep extending.
-- Each retired row left stands for a lease over the lowered limit that may
-- live, so it holds back one lane place: a lease of k jobs locks k + r usable
-- lanes (r the retired rows, counted in the snapshot that shows the lanes: a
-- snapshot that shows new lanes shows their retired rows too), fills k, and
-- clears the free place it found in r others, so that it is free for every
-- clock. With L busy lane places before, at least k + r were free, so after
-- it L + k + r <= C: the retired leases and the lane leases stay within the
-- new limit from the first lease that starts after the change (those before
-- it ran under the old one), and concurrent leasers lock disjoint lanes, each
-- counting r. A renew of a lease without a place takes no lane while a
-- retired row is left. A leaser first deletes the retired rows whose lease
-- ended at its p_now, under their row lock (queue_slots_sweep): by the job's
-- evidence, or by lease_until, which a renew of that lease (a clock behind)
-- then finds gone, as it would a lane place a leaser took. Rows are
-- replaced, never rewritten, so a leaser whose snapshot predates the change
-- finds its lanes gone (skipped), never new places checked against old
-- limits; a renew that finds its row gone looks again, with a new snapshot,
-- as often as changes replace the rows it waits for, and one whose queue has
-- no concurrency limit any more needs no place.
--
-- A queue without limits has no rows here and its leases never call this
-- file's functions: job_lease_take reads the limits of the queues it walks
-- (one probe of queues each), and the default group's fast path in job_lease
-- and job_lease_many reads them in the probe of queues it makes for pauses.

CREATE TABLE queue_slots (
    queue           text COLLATE "C" NOT NULL,
    slot            integer NOT NULL CHECK (slot BETWEEN -10000 AND 10000 AND slot <> 0),
    run_ids         text[] COLLATE "C",
    lease_sequences bigint[],
    lease_untils    bigint[],
    taken_ats       bigint[],
    PRIMARY KEY (queue, slot)
);

-- What job_renew reads to find the lane that holds a lease (a lane holds
-- several when the concurrency limit is the larger). The table holds about as
-- many rows as the smaller limits add up to, so its updates need not stay HOT.
CREATE INDEX queue_slots_by_run_id ON queue_slots USING gin (run_ids);

COMMENT ON TABLE queue_slots IS
'The rows that keep the queue limits: for each limited queue its lanes, slots 1..L with L '
'the smaller of queues.concurrency_limit and queues.rate_limit (the one it has), holding '
'its concurrency places (run_ids, lease_sequences, lease_untils: element k of lane i is '
'place (k - 1) * L + i) and rate places (taken_ats, alike), and retired concurrency '
'places above a lowered limit (slot = -place) while their lease may live. Written by '
'queue_set_concurrency and queue_set_rate (queue_slots_layout), the leases (one lane a '
'leased job) and the renews (lease_untils); clients can neither read nor write it.';
COMMENT ON COLUMN queue_slots.slot IS
'1..L: a lane, which a lease may take; negative: a retired concurrency place (-slot), '
'which only its lease''s renews write (and a leaser deletes once that lease ended); '
'each holds back one lane from the leases of the queue.';
COMMENT ON COLUMN queue_slots.run_ids IS
'The lane''s concurrency places (NULL: the queue has no concurrency limit): the job of '
'the last lease each served (with lease_sequences: that lease); a NULL element: none yet.';
COMMENT ON COLUMN queue_slots.lease_untils IS
'Each concurrency place is busy until then (the lease''s lease_until, extended by every '
'renew of it), unless the job shows that lease ended first: dispatched, released, failed, '
'or leased again (a higher lease_sequence). A NULL element: free.';
COMMENT ON COLUMN queue_slots.taken_ats IS
'The lane''s rate places (NULL: the queue has no rate limit): the p_now (or database '
'clock) of the lease each served last; usable again once taken_at <= now - '
'rate_period_ms. A NULL element: never used.';

CREATE FUNCTION queue_limit_max() RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$ SELECT 10000 $$;

COMMENT ON FUNCTION queue_limit_max() IS
'The largest concurrency or rate limit a queue may have: 10000 (one place each in '
'queue_slots).';

CREATE FUNCTION queue_slot_free(
    p_run_id text, p_lease_sequence bigint, p_lease_until bigint, p_now bigint
) RETURNS boolean
LANGUAGE sql STABLE
AS $$
    -- The row's own columns say busy; only the jobs row of exactly that lease
    -- may say it ended (see the top of this file). A job that is gone says
    -- nothing: the row stays busy until lease_until.
    SELECT p_lease_until IS NULL
        OR p_lease_until <= p_now
        OR EXISTS (SELECT FROM jobs j
                    WHERE j.run_id = p_run_id
                      AND (j.lease_sequence > p_lease_sequence
                           OR (j.lease_sequence = p_lease_sequence
                               AND (j.dispatched OR j.failed OR j.lease_holder IS NULL))))
$$;

COMMENT ON FUNCTION queue_slot_free(text, bigint, bigint, bigint) IS
'Whether a concurrency place (its run_id, lease_sequence and lease_until) serves no live '
'lease at p_now: it never served one, its lease_until <= p_now, or the job of its lease '
'(p_run_id, p_lease_sequence) shows that '
'lease ended (dispatched, released, failed, or leased again). A cancelled job''s live '
'lease keeps its place: its dispatch may still be running. p_now NULL: only the job''s '
'evidence frees a place that served a lease (NULL, not true, otherwise).';

CREATE FUNCTION check_queue_limit(p_param text, p_value integer) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value < 1 OR p_value > queue_limit_max()
                THEN raise_invalid(format(
                         '%s must be NULL (no limit) or an integer from 1 to %s',
                         p_param, queue_limit_max()))
           END
$$;

COMMENT ON FUNCTION check_queue_limit(text, integer) IS
'Raises 22023 naming p_param unless p_value is NULL (no limit) or from 1 to '
'queue_limit_max().';

CREATE FUNCTION queue_lane_free(
    p_run_ids text[], p_lease_sequences bigint[], p_lease_untils bigint[], p_now bigint
) RETURNS integer
LANGUAGE sql STABLE
AS $$
    -- One place (a lane of a queue whose concurrency limit is the smaller, or
    -- its only one): no walk of the array.
    SELECT CASE WHEN cardinality(p_lease_untils) = 1
                THEN CASE WHEN queue_slot_free(p_run_ids[1], p_lease_sequences[1],
                                               p_lease_untils[1], p_now)
                          THEN 1 END
                ELSE (SELECT min(k)
                        FROM generate_subscripts(p_lease_untils, 1) AS k
                       WHERE queue_slot_free(p_run_ids[k], p_lease_sequences[k],
                                             p_lease_untils[k], p_now)) END
$$;

COMMENT ON FUNCTION queue_lane_free(text[], bigint[], bigint[], bigint) IS
'The first of a lane''s concurrency places (p_run_ids[k], p_lease_sequences[k], '
'p_lease_untils[k]) that serves no live lease at p_now (queue_slot_free), by k; NULL when '
'every one does, or the arrays are NULL.';

CREATE FUNCTION queue_lane_usable(p_taken_ats bigint[], p_period_ms bigint, p_now bigint)
RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$
    -- The window's start in numeric: one before the smallest bigint is no
    -- overflow.
    SELECT CASE WHEN cardinality(p_taken_ats) = 1
                THEN CASE WHEN p_taken_ats[1] IS NULL
                            OR p_taken_ats[1]::numeric <= p_now::numeric - p_period_ms
                          THEN 1 END
                ELSE (SELECT min(k)
                        FROM generate_subscripts(p_taken_ats, 1) AS k
                       WHERE p_taken_ats[k] IS NULL
                          OR p_taken_ats[k]::numeric <= p_now::numeric - p_period_ms) END
$$;

COMMENT ON FUNCTION queue_lane_usable(bigint[], bigint, bigint) IS
'The first of a lane''s rate places p_taken_ats[k] that a lease at p_now may take: never '
'used, or used at least p_period_ms before p_now; NULL when none, or p_taken_ats is NULL.';

CREATE FUNCTION queue_slots_layout(p_queue text, p_concurrency integer, p_rate integer)
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

CREATE FUNCTION queue_set_concurrency(p_queue text, p_limit integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old  integer;
    v_rate integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    PERFORM check_queue_limit('limit', p_limit);

    -- The queue's row, locked: two calls for one queue take turns.
    SELECT q.concurrency_limit, q.rate_limit INTO v_old, v_rate
      FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL OR v_old IS NOT DISTINCT FROM p_limit THEN
        RETURN false;
    END IF;
    -- A name of at most 1024 characters can still exceed the btree's limit on
    -- index entries (incompressible multibyte characters): bad input, not a crash.
    -- queue_slots' key, (queue, slot), is a few bytes wider than queues': a name
    -- that fits the one may not fit the other, so both writes are in the block.
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, concurrency_limit)
        VALUES (p_queue, now_ms(), p_limit)
        ON CONFLICT (queue) DO UPDATE
            SET concurrency_limit = excluded.concurrency_limit,
                updated_at = excluded.updated_at;

        -- No limit: the concurrency places go, busy or not (a renew then needs
        -- none). Lowered: the places above it are never taken again; those whose
        -- lease may live serve it to its end (its renews keep them) and go at a
        -- later change once that lease shows it ended.
        PERFORM queue_slots_layout(p_queue, p_limit, v_rate);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;
    -- Idle dispatchers wake: a raised (or removed) limit may free due jobs.
    PERFORM pg_notify(job_channel(), now_ms()::text);
    RETURN true;
END
$$;

COMMENT ON FUNCTION queue_set_concurrency(text, integer) IS
'Sets the concurrency limit of the queue p_queue (any name: it need not hold jobs) to '
'p_limit: job_lease and job_lease_many then hold at most p_limit live leases of its jobs '
'at once, across every caller (NULL: no limit). A live lease counts until it expires or '
'its job is dispatched, released or failed (a cancelled job''s lease still counts: its '
'dispatch may be running). Leases taken before the limit was set count from their next '
'renew, which answers false (and ends the lease) when the queue is full; lowering the '
'limit ends no lease. Waits for the leases and renews of the queue''s limited jobs in '
'flight (queue_slots_layout). Answers true when the limit changed, false when it was '
'p_limit already (nothing changes); at commit a change notifies job_channel(). 22023 and '
'nothing changes: p_queue NULL, empty or longer than 1024 characters, p_limit below 1 or '
'above queue_limit_max().';

CREATE FUNCTION queue_set_rate(p_queue text, p_limit integer, p_period_ms bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old_limit  integer;
    v_old_period bigint;
    v_conc       integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    PERFORM check_queue_limit('limit', p_limit);
    IF (p_limit IS NULL) <> (p_period_ms IS NULL)
       OR p_period_ms < 1 OR p_period_ms > 31622400000 THEN
        PERFORM raise_invalid(
            'period_ms must be NULL exactly when limit is, else from 1 to 31622400000 '
            '(366 days)');
    END IF;

    SELECT q.rate_limit, q.rate_period_ms, q.concurrency_limit
      INTO v_old_limit, v_old_period, v_conc
      FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL
       OR (v_old_limit, v_old_period) IS NOT DISTINCT FROM (p_limit, p_period_ms) THEN
        RETURN false;
    END IF;
    -- As in queue_set_concurrency: queue_slots' key is wider than queues'.
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, rate_limit, rate_period_ms)
        VALUES (p_queue, now_ms(), p_limit, p_period_ms)
        ON CONFLICT (queue) DO UPDATE
            SET rate_limit = excluded.rate_limit,
                rate_period_ms = excluded.rate_period_ms,
                updated_at = excluded.updated_at;

        -- The places up to the new limit keep their taken_at: a lease taken
        -- before a change still counts in the windows it falls in, measured with
        -- the new period.
        PERFORM queue_slots_layout(p_queue, v_conc, p_limit);
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;
    PERFORM pg_notify(job_channel(), now_ms()::text);
    RETURN true;
END
$$;

COMMENT ON FUNCTION queue_set_rate(text, integer, bigint) IS
'Sets the rate limit of the queue p_queue (any name) to p_limit leases per p_period_ms: '
'job_lease and job_lease_many then lease at most p_limit of its jobs in any window of '
'p_period_ms, across every caller, measured with each lease''s p_now (NULL: the database '
'clock). Both NULL: no limit. Leases taken before a change count in the windows they fall '
'in (up to the new limit). Waits for the leases and renews of the queue''s limited jobs '
'in flight (queue_slots_layout). Answers true when the limit changed, false when it was '
'that already (nothing changes); at commit a change notifies job_channel(). 22023 and '
'nothing changes: p_queue NULL, empty or longer than 1024 characters, p_limit below 1 or '
'above queue_limit_max(), p_period_ms NULL while p_limit is not (or the other way round), '
'below 1 or above 31622400000 (366 days).';

CREATE FUNCTION queue_limits_wants(
    p_queues text[], p_prios integer[], p_limited text[], p_now bigint, p_limit integer
) RETURNS TABLE (queue text, want integer)
LANGUAGE sql STABLE
AS $$
    -- How many jobs of each queue a lease could take now, up to p_limit: the
    -- leasable rows of each of its (queue, priority) groups, read in the group's
    -- index (its predicate stated, as job_lease_take's reads do), up to p_limit
    -- each. Rows other leasers hold locked right now are counted too.
    SELECT g.queue,
           least(p_limit, sum(
               CASE WHEN g.queue = 'default' AND g.priority = 0
                    THEN (SELECT count(*)
                            FROM (SELECT
                                    FROM jobs c
                                   WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                                     AND c.queue = 'default' AND c.priority = 0
                                     AND c.dispatch_at <= p_now
                                     AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                                   ORDER BY c.dispatch_at, c.run_id
                                   LIMIT p_limit) d)
                    ELSE (SELECT count(*)
                            FROM (SELECT
                                    FROM jobs c
                                   WHERE NOT c.dispatched AND NOT c.cancelled AND NOT c.failed
                                     AND (c.queue <> 'default' OR c.priority <> 0)
                                     AND c.queue = g.queue AND c.priority = g.priority
                                     AND c.dispatch_at <= p_now
                                     AND (c.lease_until IS NULL OR c.lease_until <= p_now)
                                   ORDER BY c.dispatch_at, c.run_id
                                   LIMIT p_limit) o) END))::integer
      FROM unnest(p_queues, p_prios) AS g(queue, priority)
     WHERE g.queue = ANY (p_limited)
     GROUP BY g.queue
$$;

COMMENT ON FUNCTION queue_limits_wants(text[], integer[], text[], bigint, integer) IS
'For the (queue, priority) groups (p_queues[i], p_prios[i]) of the queues p_limited '
'names: how many '
'jobs of each queue are leasable at p_now, up to p_limit (one bounded read of each '
'group''s index). What job_lease_take asks queue_limits_reserve for, so that it locks '
'no more rows than it could fill.';

CREATE FUNCTION queue_limits_reserve(p_queues text[], p_wants integer[], p_now bigint)
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

CREATE FUNCTION queue_limits_fill(
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

CREATE FUNCTION queue_limits_keep(
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

CREATE FUNCTION queue_limits_caps(p_limits jsonb, p_queues text[]) RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    -- {queue: cap - jobs of the queue leased so far}, for job_lease_take's rounds.
    SELECT coalesce(jsonb_object_agg(l.key, (l.value ->> 'cap')::integer
                                            - (SELECT count(*) FROM unnest(p_queues) AS j(queue)
                                                WHERE j.queue = l.key)),
                    '{}')
      FROM jsonb_each(p_limits) l
$$;

COMMENT ON FUNCTION queue_limits_caps(jsonb, text[]) IS
'{queue: how many more of its jobs the lease may take}: each queue''s cap in p_limits '
'(queue_limits_reserve''s answer) less its leases so far (p_queues: one element a lease).';
