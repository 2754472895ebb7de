-- pgstore: the job store's table.
--
-- The store never prunes the table on its own: dispatched and cancelled jobs
-- are kept for reconciliation (job_list_dispatched) until the owner purges
-- them (job_purge, by finished_at). The lease path reads
-- a partial index that holds only the jobs still waiting to be dispatched, so
-- its cost depends on the pending jobs, not on the history.
--
-- Leases and renews change only lease_holder, lease_until, lease_sequence and
-- attempts, which no index covers, so they stay HOT (heap-only) updates; fillfactor 70
-- leaves the room on each page for that. Marking a job dispatched, cancelled or failed
-- changes the partial index's predicate, so those updates are not HOT (they happen once
-- per job).

CREATE TABLE jobs (
    run_id       text COLLATE "C" PRIMARY KEY,
    dispatch_at  bigint  NOT NULL,
    lease_holder text,
    lease_until  bigint,
    worker_id    text,
    dispatched   boolean NOT NULL DEFAULT false,
    cancelled    boolean NOT NULL DEFAULT false,
    lease_sequence bigint NOT NULL DEFAULT 0 CHECK (lease_sequence >= 0),
    finished_at  bigint,
    attempts     integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts integer NOT NULL DEFAULT 25 CHECK (max_attempts > 0),
    last_error   text,
    failed       boolean NOT NULL DEFAULT false,
    queue        text COLLATE "C" NOT NULL DEFAULT 'default',
    priority     integer NOT NULL DEFAULT 0,
    payload      jsonb
) WITH (fillfactor = 70);

-- The waiting jobs are split between two partial indexes, each job in exactly
-- one: the default group (queue 'default', priority 0: every job of an app that
-- uses neither queues nor priorities) by due order, as before pgstore_0019, and
-- every other job by queue and priority. A lease that updates a job outside the
-- page (not HOT) adds an entry to one of them only, so the common case costs
-- what it cost before queues; and the lease reads each group in due order from
-- an index that holds that group's jobs alone (never walking a paused queue's
-- backlog). Readers of every waiting job read both (UNION ALL).
CREATE INDEX jobs_pending_by_dispatch_at ON jobs (dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed
      AND queue = 'default' AND priority = 0;

CREATE INDEX jobs_pending_by_queue ON jobs (queue, priority DESC, dispatch_at, run_id)
    WHERE NOT dispatched AND NOT cancelled AND NOT failed
      AND (queue <> 'default' OR priority <> 0);

-- The same jobs by due time alone: one probe, from now backwards, tells a
-- lease whether any job outside the default group is due, so that when none is
-- (future jobs of a higher priority, or a paused queue's backlog not yet due)
-- the lease is the default group's walk alone, as in a table without them. It
-- adds an entry only where jobs_pending_by_queue does (the same jobs): a
-- default-group job never touches it. "failed IS NOT TRUE" (the same as NOT
-- failed on this NOT NULL column) is written so that the probe, which says it
-- too, implies this index's predicate and not jobs_pending_by_queue's: the
-- planner cannot answer the probe by reading that index whole and sorting,
-- which it did pick while the statistics showed no job outside the default
-- group (both plans then cost the same).
CREATE INDEX jobs_pending_others_by_dispatch_at ON jobs (dispatch_at)
    WHERE NOT dispatched AND NOT cancelled AND failed IS NOT TRUE
      AND (queue <> 'default' OR priority <> 0);

-- What job_purge walks: finished jobs only, oldest first. Leases never change
-- finished_at, so they stay HOT.
CREATE INDEX jobs_finished_by_finished_at ON jobs (finished_at, run_id)
    WHERE finished_at IS NOT NULL;

COMMENT ON TABLE jobs IS
'Delayed dispatch with holder leases ("send a bot into meeting R at 10:00"). '
'Written only through the job_* functions; dispatched, cancelled and failed jobs are '
'kept until job_purge deletes them.';
COMMENT ON COLUMN jobs.dispatch_at IS
'Epoch ms when the job is due; job_release moves it to the retry time.';
COMMENT ON COLUMN jobs.lease_until IS
'Epoch ms until which lease_holder holds the job; the lease is live while lease_until > now.';
COMMENT ON COLUMN jobs.worker_id IS
'Set by job_mark_dispatched: the provider''s worker that carries out the job.';
COMMENT ON INDEX jobs_pending_by_dispatch_at IS
'The lease path of the default group: the pending jobs in queue ''default'' at priority '
'0 only, in lease order, so the lease cost does not grow with dispatched, cancelled and '
'failed history (every other pending job: jobs_pending_by_queue).';
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
COMMENT ON COLUMN jobs.attempts IS
'How many times the job was leased since it was scheduled (or retried): every '
'job_lease adds one, job_retry resets it to 0. Counted from pgstore_0010 on.';
COMMENT ON COLUMN jobs.max_attempts IS
'The most leases the job may have: a job is leased at most max_attempts times. Once '
'attempts >= max_attempts, a job_release of its last lease fails the job, and so does '
'the job_lease (or job_lease_many) that finds it due again after that lease expired. '
'job_schedule''s p_max_attempts, or store_settings.default_max_attempts '
'when the job was scheduled without one (job_schedule always writes it: the column''s '
'own default, 25, is for rows written otherwise).';
COMMENT ON COLUMN jobs.last_error IS
'The p_error of the latest job_release that gave one (at most 4096 characters); '
'NULL until then.';
COMMENT ON COLUMN jobs.failed IS
'Terminal: set, once attempts >= max_attempts, by the job_release of the job''s last '
'lease or by the job_lease (or job_lease_many) that finds that lease expired. A failed '
'job is never leased again; job_retry puts it back to waiting, job_purge deletes it.';
COMMENT ON INDEX jobs_pending_by_queue IS
'The lease path since pgstore_0019 of every pending job outside the default group '
'(queue ''default'', priority 0: jobs_pending_by_dispatch_at), by queue, priority '
'(highest first), dispatch_at and run_id. job_lease reads the due head of each (queue, '
'priority) group, so its cost depends on the number of groups, not on the backlog.';
COMMENT ON INDEX jobs_pending_others_by_dispatch_at IS
'The pending jobs of jobs_pending_by_queue (outside the default group) by dispatch_at: '
'job_lease and job_lease_many read its last entry up to now to tell whether any of them '
'is due; when none is, the lease walks the default group alone.';
COMMENT ON COLUMN jobs.queue IS
'The job''s queue (''default'' unless job_schedule was given one): job_lease and '
'job_lease_many lease from the queues their p_queues names (NULL: every queue).';
COMMENT ON COLUMN jobs.priority IS
'Higher is leased first among due jobs (then earliest dispatch_at, then run_id); 0 '
'unless job_schedule was given one.';
COMMENT ON COLUMN jobs.payload IS
'What the job carries for its dispatcher (any JSON, at most '
'store_settings.max_payload_bytes as JSON text), or NULL: none.';
COMMENT ON INDEX jobs_finished_by_finished_at IS
'The purge path: finished jobs only, oldest finished_at first.';

-- Lease sequences outlive the rows they were handed out on. A run_id purged
-- or removed and then scheduled again must not start over at lease_sequence 1:
-- a dispatch that outlived its lease would have its fenced mark recorded on
-- the new job. Not one fence row per deleted run_id (job_purge exists to free
-- storage; such a table would grow with every run id ever purged), but one
-- store-wide high-water mark: every DELETE of jobs raises it, in the same
-- statement, to the greatest lease_sequence it deleted (never lowers it), and every lease hands out more than
-- it, reading it in the leasing UPDATE itself (under READ COMMITTED a read in
-- an earlier statement could predate a purge that committed before the row
-- was scheduled again). The cost: every job's sequences, not only a returning
-- run_id's, start above the mark.

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

-- The queue controls (sql/23_queues.sql). A queue needs no row to exist: a job's
-- queue is its jobs.queue, and job_schedule writes nothing here (no cost on the
-- schedule path). queue_pause writes the row of a queue it pauses; queue_resume
-- clears its flag; queue_set_concurrency and queue_set_rate write the limits
-- (sql/24_queue_limits.sql). job_lease reads it once per (queue, priority)
-- group it finds, paused and limits at once.

CREATE TABLE queues (
    queue      text COLLATE "C" PRIMARY KEY,
    paused     boolean NOT NULL DEFAULT false,
    updated_at bigint  NOT NULL,
    concurrency_limit integer CHECK (concurrency_limit BETWEEN 1 AND 10000),
    rate_limit        integer CHECK (rate_limit BETWEEN 1 AND 10000),
    rate_period_ms    bigint CHECK (rate_period_ms BETWEEN 1 AND 31622400000),
    CHECK ((rate_limit IS NULL) = (rate_period_ms IS NULL))
);

COMMENT ON TABLE queues IS
'The queue controls: one row per queue ever paused or limited (queue_pause writes it, '
'queue_resume clears paused, queue_set_concurrency and queue_set_rate set the limits). '
'Written only through those functions; a queue with no row is neither paused nor limited.';
COMMENT ON COLUMN queues.paused IS
'True: job_lease and job_lease_many lease none of the queue''s jobs (leases already '
'held run on, and may be renewed, marked and released).';
COMMENT ON COLUMN queues.updated_at IS
'Epoch ms (the database clock) of the last queue_pause, queue_resume, '
'queue_set_concurrency or queue_set_rate that changed the row.';
COMMENT ON COLUMN queues.concurrency_limit IS
'At most this many live leases of the queue''s jobs at once (queue_set_concurrency); '
'NULL: no limit. Enforced through queue_slots (sql/24_queue_limits.sql).';
COMMENT ON COLUMN queues.rate_limit IS
'At most this many leases of the queue''s jobs in any window of rate_period_ms '
'(queue_set_rate); NULL: no limit. Enforced through queue_slots.';
COMMENT ON COLUMN queues.rate_period_ms IS
'The window of rate_limit, in ms (at most 366 days); NULL exactly when rate_limit is.';
