-- pgstore: the queue limits (docs/queues.md, "Limits").
--
-- A concurrency limit (at most N live leases of a queue's jobs at once) and a
-- rate limit (at most N leases of them in any window of one period), each kept
-- by N rows of queue_slots, so that it holds across hosts and languages with
-- one row lock a leased job and no counter that every leaser would queue on:
--
-- * a lease of a job in a limited queue first locks a usable row of each of
--   the queue's limits (FOR UPDATE SKIP LOCKED: a leaser never waits on
--   another), leases at most as many of the queue's jobs as it locked rows,
--   and writes each leased job into its rows in the same transaction;
-- * a concurrency row is busy while its own lease_until lies ahead, unless
--   the jobs row shows that this very lease (its run_id and lease_sequence)
--   ended: dispatched, released, failed, or leased again. Only that positive
--   evidence frees it early, never the absence of a row or of a lease, because
--   under READ COMMITTED a leaser re-checks a row that another leaser just
--   took (EvalPlanQual) with its own, older snapshot of jobs, in which that
--   lease may not exist yet. So mark, release and cancel write nothing here;
--   job_renew and job_renew_many extend the row (the only writers besides
--   the lease), which a leaser then sees in the row itself;
-- * a rate row is usable when its taken_at is at least one period old: each
--   row serves at most one lease in any window of one period, so N rows serve
--   at most N.
--
-- A queue without limits has no rows here and its leases never call this
-- file's functions: job_lease_take reads the limits of the queues it walks
-- (one probe of queues each), and the default group's fast path in job_lease
-- and job_lease_many reads them in the probe of queues it makes for pauses.

CREATE TABLE queue_slots (
    queue          text COLLATE "C" NOT NULL,
    kind           text COLLATE "C" NOT NULL CHECK (kind IN ('concurrency', 'rate')),
    slot           integer NOT NULL CHECK (slot BETWEEN 1 AND 10000),
    run_id         text COLLATE "C",
    lease_sequence bigint,
    lease_until    bigint,
    taken_at       bigint,
    PRIMARY KEY (queue, kind, slot)
);

-- What job_renew reads to find the row a lease holds. The table holds as many
-- rows as the limits add up to, so its updates need not stay HOT.
CREATE INDEX queue_slots_by_run_id ON queue_slots (run_id);

COMMENT ON TABLE queue_slots IS
'The rows that keep the queue limits: slots 1..queues.concurrency_limit of kind '
'''concurrency'' and 1..queues.rate_limit of kind ''rate'' for each limited queue. Written '
'by queue_set_concurrency and queue_set_rate (rows), the leases (the lease a row serves) '
'and the renews (lease_until); clients can neither read nor write it.';
COMMENT ON COLUMN queue_slots.kind IS
'''concurrency'': the row is one of the queue''s concurrency_limit live leases; '
'''rate'': one of its rate_limit leases a rate_period_ms.';
COMMENT ON COLUMN queue_slots.run_id IS
'The job of the last lease the row served (with lease_sequence: that lease); NULL: none yet.';
COMMENT ON COLUMN queue_slots.lease_until IS
'Concurrency rows: the row is busy until then (the lease''s lease_until, extended by every '
'renew of it), unless the job shows that lease ended first: dispatched, released, failed, '
'or leased again (a higher lease_sequence). NULL: free. Rate rows: NULL.';
COMMENT ON COLUMN queue_slots.taken_at IS
'The p_now (or database clock) of the lease the row served last; a rate row is usable '
'again once taken_at <= now - rate_period_ms.';

CREATE FUNCTION queue_limit_max() RETURNS integer
LANGUAGE sql IMMUTABLE
AS $$ SELECT 10000 $$;

COMMENT ON FUNCTION queue_limit_max() IS
'The largest concurrency or rate limit a queue may have: 10000 (one queue_slots row each).';

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
'Whether a concurrency row (its run_id, lease_sequence and lease_until) serves no live '
'lease at p_now: it never served one, its lease_until <= p_now, or the job of its lease '
'(p_run_id, p_lease_sequence) shows that '
'lease ended (dispatched, released, failed, or leased again). A cancelled job''s live '
'lease keeps its row: its dispatch may still be running. p_now NULL: only the job''s '
'evidence frees a row that served a lease (NULL, not true, otherwise).';

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

CREATE FUNCTION queue_set_concurrency(p_queue text, p_limit integer) RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old integer;
BEGIN
    PERFORM check_primary();
    PERFORM check_name('queue', p_queue);
    PERFORM check_queue_limit('limit', p_limit);

    -- The queue's row, locked: two calls for one queue take turns.
    SELECT q.concurrency_limit INTO v_old FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL OR v_old IS NOT DISTINCT FROM p_limit THEN
        RETURN false;
    END IF;
    -- A name of at most 1024 characters can still exceed the btree's limit on
    -- index entries (incompressible multibyte characters): bad input, not a crash.
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, concurrency_limit)
        VALUES (p_queue, now_ms(), p_limit)
        ON CONFLICT (queue) DO UPDATE
            SET concurrency_limit = excluded.concurrency_limit,
                updated_at = excluded.updated_at;
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;

    IF p_limit IS NULL THEN
        -- No limit: the rows go, busy or not (a renew then needs none).
        DELETE FROM queue_slots s WHERE s.queue = p_queue AND s.kind = 'concurrency';
    ELSE
        INSERT INTO queue_slots (queue, kind, slot)
        SELECT p_queue, 'concurrency', g FROM generate_series(1, p_limit) AS g
        ON CONFLICT DO NOTHING;
        -- Lowered: the rows above the limit are never taken again. Those that
        -- serve no lease go now; one whose lease may live serves it to its end (its
        -- renews keep it) and goes at a later call once that lease shows it ended.
        -- No clock decides it here (a NULL now: lease_until alone frees nothing),
        -- so a holder whose p_now runs behind the database clock keeps its row.
        DELETE FROM queue_slots s
         WHERE (s.queue, s.kind, s.slot) IN (
                   SELECT f.queue, f.kind, f.slot
                     FROM queue_slots f
                    WHERE f.queue = p_queue AND f.kind = 'concurrency' AND f.slot > p_limit
                      AND queue_slot_free(f.run_id, f.lease_sequence, f.lease_until, NULL)
                      FOR UPDATE SKIP LOCKED);
    END IF;
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
'limit ends no lease. Answers true when the limit changed, false when it was p_limit '
'already (nothing changes); at commit a change notifies job_channel(). 22023 and nothing '
'changes: p_queue NULL, empty or longer than 1024 characters, p_limit below 1 or above '
'queue_limit_max().';

CREATE FUNCTION queue_set_rate(p_queue text, p_limit integer, p_period_ms bigint)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_old_limit  integer;
    v_old_period bigint;
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

    SELECT q.rate_limit, q.rate_period_ms INTO v_old_limit, v_old_period
      FROM queues q WHERE q.queue = p_queue FOR UPDATE;
    IF NOT FOUND AND p_limit IS NULL
       OR (v_old_limit, v_old_period) IS NOT DISTINCT FROM (p_limit, p_period_ms) THEN
        RETURN false;
    END IF;
    BEGIN
        INSERT INTO queues AS q (queue, updated_at, rate_limit, rate_period_ms)
        VALUES (p_queue, now_ms(), p_limit, p_period_ms)
        ON CONFLICT (queue) DO UPDATE
            SET rate_limit = excluded.rate_limit,
                rate_period_ms = excluded.rate_period_ms,
                updated_at = excluded.updated_at;
    EXCEPTION WHEN program_limit_exceeded THEN
        RAISE EXCEPTION USING
            ERRCODE = 'invalid_parameter_value',
            MESSAGE = 'queue is too long to index: at most about 2700 bytes of UTF-8';
    END;

    -- The rows keep their taken_at: a lease taken before a change still counts
    -- in the windows it falls in, measured with the new period.
    DELETE FROM queue_slots s
     WHERE s.queue = p_queue AND s.kind = 'rate' AND s.slot > coalesce(p_limit, 0);
    IF p_limit IS NOT NULL THEN
        INSERT INTO queue_slots (queue, kind, slot)
        SELECT p_queue, 'rate', g FROM generate_series(1, p_limit) AS g
        ON CONFLICT DO NOTHING;
    END IF;
    PERFORM pg_notify(job_channel(), now_ms()::text);
    RETURN true;
END
$$;

COMMENT ON FUNCTION queue_set_rate(text, integer, bigint) IS
'Sets the rate limit of the queue p_queue (any name) to p_limit leases per p_period_ms: '
'job_lease and job_lease_many then lease at most p_limit of its jobs in any window of '
'p_period_ms, across every caller, measured with each lease''s p_now (NULL: the database '
'clock). Both NULL: no limit. Leases taken before a change count in the windows they fall '
'in (up to the new limit). Answers true when the limit changed, false when it was that '
'already (nothing changes); at commit a change notifies job_channel(). 22023 and nothing '
'changes: p_queue NULL, empty or longer than 1024 characters, p_limit below 1 or above '
'queue_limit_max(), p_period_ms NULL while p_limit is not (or the other way round), below '
'1 or above 31622400000 (366 days).';

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
    v_queue  text;
    v_conc   integer;
    v_rate   integer;
    v_period bigint;
    v_slots  integer[];
    v_tokens integer[];
    v_want   integer;
    v_out    jsonb := '{}'::jsonb;
BEGIN
    FOR v_queue, v_want, v_conc, v_rate, v_period IN
        SELECT q.queue, w.want, q.concurrency_limit, q.rate_limit, q.rate_period_ms
          FROM unnest(p_queues, p_wants) AS w(queue, want)
          JOIN queues q ON q.queue = w.queue
         WHERE q.concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL
         ORDER BY q.queue
    LOOP
        v_slots := NULL;
        v_tokens := NULL;
        -- The rate first: a lease in a queue with both limits locks only as
        -- many concurrency rows as it got rate rows. (The window's start in
        -- numeric: one before the smallest bigint is no overflow.)
        IF v_rate IS NOT NULL THEN
            SELECT coalesce(array_agg(s.slot), '{}') INTO v_tokens
              FROM (SELECT s.slot
                      FROM queue_slots s
                     WHERE s.queue = v_queue AND s.kind = 'rate' AND s.slot <= v_rate
                       AND (s.taken_at IS NULL OR s.taken_at::numeric <= p_now::numeric - v_period)
                     ORDER BY s.slot
                     LIMIT v_want
                       FOR UPDATE SKIP LOCKED) s;
            v_want := cardinality(v_tokens);
        END IF;
        IF v_conc IS NOT NULL AND v_want > 0 THEN
            SELECT coalesce(array_agg(s.slot), '{}') INTO v_slots
              FROM (SELECT s.slot
                      FROM queue_slots s
                     WHERE s.queue = v_queue AND s.kind = 'concurrency' AND s.slot <= v_conc
                       AND queue_slot_free(s.run_id, s.lease_sequence, s.lease_until, p_now)
                     ORDER BY s.slot
                     LIMIT v_want
                       FOR UPDATE SKIP LOCKED) s;
            v_want := cardinality(v_slots);
        ELSIF v_conc IS NOT NULL THEN
            v_slots := '{}';
        END IF;
        v_out := v_out || jsonb_build_object(
            v_queue, jsonb_build_object('cap', v_want, 'slots', v_slots,
                                        'tokens', v_tokens[1:v_want]));
    END LOOP;
    RETURN v_out;
END
$$;

COMMENT ON FUNCTION queue_limits_reserve(text[], integer[], bigint) IS
'For each queue p_queues[i] that has a limit: locks (FOR UPDATE SKIP LOCKED) up to '
'p_wants[i] usable rows of each of its limits at p_now (rate rows at least rate_period_ms '
'old, then as many free concurrency rows, queue_slot_free) and answers {queue: {cap, '
'slots, tokens}}: the lease may take at most cap of the queue''s jobs, and '
'queue_limits_fill writes them into those rows. Queues without limits are left out; '
'''{}'' when none has one. Rows it locks and does not fill are let go at commit, unwritten.';

CREATE FUNCTION queue_limits_fill(
    p_limits jsonb, p_queues text[], p_run_ids text[], p_sequences bigint[],
    p_now bigint, p_until bigint
) RETURNS void
LANGUAGE plpgsql
AS $$
-- Runs as its caller, job_lease_take, in the transaction that reserved the
-- rows (it holds their locks) and took the leases (p_queues[i], p_run_ids[i],
-- p_sequences[i]).
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    -- The i-th leased job of a queue (by run_id) gets the queue's i-th
    -- reserved row of each kind.
    -- More leased jobs than reserved rows would be a bug of the caller's: an
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
       SET run_id = p.run_id,
           lease_sequence = p.lease_sequence,
           lease_until = CASE WHEN p.kind = 'concurrency' THEN p_until END,
           taken_at = p_now
      FROM (SELECT l.queue, l.run_id, l.lease_sequence, k.kind, k.slot
              FROM (SELECT j.queue, j.run_id, j.lease_sequence,
                           row_number() OVER (PARTITION BY j.queue ORDER BY j.run_id) - 1 AS i
                      FROM unnest(p_queues, p_run_ids, p_sequences)
                           AS j(queue, run_id, lease_sequence)
                     WHERE p_limits ? j.queue) l
             CROSS JOIN LATERAL (
                   VALUES ('concurrency', (p_limits -> l.queue -> 'slots' ->> l.i::integer)::integer),
                          ('rate', (p_limits -> l.queue -> 'tokens' ->> l.i::integer)::integer)
                   ) AS k(kind, slot)
             WHERE k.slot IS NOT NULL) p
     WHERE s.queue = p.queue AND s.kind = p.kind AND s.slot = p.slot;
END
$$;

COMMENT ON FUNCTION queue_limits_fill(jsonb, text[], text[], bigint[], bigint, bigint) IS
'Writes the leases (p_queues[i], p_run_ids[i], p_sequences[i]) into the rows '
'queue_limits_reserve '
'answered in p_limits: a concurrency row gets the lease (run_id, lease_sequence) and '
'lease_until p_until, a rate row taken_at p_now. Raises (P0001) rather than record more '
'leases of a queue than its cap.';

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
    v_kept text[];
    v_lost text[] := ARRAY[]::text[];
    v_job  record;
BEGIN
    -- The row each lease holds. The row lock orders this with a leaser that
    -- found the row free (its lease_until passed on that leaser's clock): either
    -- it took the row first (this UPDATE then finds another lease in it) or it
    -- sees the extended lease_until.
    WITH kept AS (
        UPDATE queue_slots s
           SET lease_until = greatest(s.lease_until, p_until)
          FROM unnest(p_queues, p_run_ids, p_sequences) AS u(queue, run_id, seq)
         WHERE s.run_id = u.run_id AND s.lease_sequence = u.seq
           AND s.queue = u.queue AND s.kind = 'concurrency'
        RETURNING s.run_id)
    SELECT coalesce(array_agg(k.run_id), '{}') INTO v_kept FROM kept k;

    -- A lease without a row (taken before the limit was set, or its row taken
    -- by a leaser whose clock ran past its lease_until) takes a free one, or
    -- is lost.
    FOR v_job IN
        SELECT u.queue, u.run_id, u.seq
          FROM unnest(p_queues, p_run_ids, p_sequences) AS u(queue, run_id, seq)
         WHERE NOT u.run_id = ANY (v_kept)
         ORDER BY u.run_id
    LOOP
        UPDATE queue_slots s
           SET run_id = v_job.run_id, lease_sequence = v_job.seq,
               lease_until = p_until, taken_at = p_now
         WHERE (s.queue, s.kind, s.slot) = (
                   SELECT f.queue, f.kind, f.slot
                     FROM queue_slots f
                     JOIN queues q ON q.queue = f.queue
                    WHERE f.queue = v_job.queue AND f.kind = 'concurrency'
                      AND f.slot <= q.concurrency_limit
                      AND queue_slot_free(f.run_id, f.lease_sequence, f.lease_until, p_now)
                    ORDER BY f.slot
                    LIMIT 1
                      FOR UPDATE OF f SKIP LOCKED);
        IF NOT FOUND THEN
            v_lost := v_lost || v_job.run_id;
        END IF;
    END LOOP;
    RETURN v_lost;
END
$$;

COMMENT ON FUNCTION queue_limits_keep(text[], text[], bigint[], bigint, bigint) IS
'For the renewed leases (p_queues[i], p_run_ids[i], p_sequences[i]) of queues with a '
'concurrency limit: extends the concurrency row each holds to p_until, or gives one that '
'holds none a free row; answers the run_ids of those that found none (the queue is full: '
'their renew must fail and their lease end).';

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
