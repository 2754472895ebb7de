-- pgstore: the schedule store's tables.
--
-- Storage is chosen for the claim path, which updates the same rows all day:
-- fillfactor 70 leaves room on each page for the new row version, and the
-- only index is the primary key, so claim, renew and complete never change an
-- indexed column and stay HOT (heap-only) updates. schedule_claim_next with
-- p_ids probes the primary key; without p_ids it scans the table, which is
-- the price of keeping every update HOT (see README, "Storage").

-- The jittered due time of an occurrence (the schedules.due_at column's
-- expression): next_run_at plus a deterministic offset in [0, jitter_ms), the
-- first 48 bits of md5(id || ' ' || next_run_at) modulo jitter_ms, so every
-- host and language computes the same one (pgstore.models.due_at in Python),
-- and a burst of schedules due at the top of the hour spreads over jitter_ms.
-- Capped at the bigint maximum, never an overflow.
CREATE FUNCTION schedule_due_at(p_id text, p_next_run_at bigint, p_jitter_ms bigint)
RETURNS bigint
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT CASE WHEN p_next_run_at IS NULL OR p_jitter_ms IS NULL OR p_jitter_ms <= 0
                THEN p_next_run_at
                ELSE (SELECT CASE WHEN p_next_run_at > 9223372036854775807 - o.offset_ms
                                  THEN 9223372036854775807
                                  ELSE p_next_run_at + o.offset_ms END
                        FROM (SELECT ('x' || left(md5(p_id || ' ' || p_next_run_at::text), 12))
                                         ::bit(48)::bigint % p_jitter_ms AS offset_ms) AS o)
           END
$$;

COMMENT ON FUNCTION schedule_due_at(text, bigint, bigint) IS
'p_next_run_at plus the deterministic jitter of (p_id, p_next_run_at): the first 48 bits '
'of md5(p_id || '' '' || p_next_run_at) modulo p_jitter_ms, in [0, p_jitter_ms); '
'p_next_run_at itself when p_jitter_ms is 0 (or NULL); NULL for NULL; at most the bigint '
'maximum.';

CREATE TABLE schedules (
    id            text COLLATE "C" PRIMARY KEY,
    kind          text   NOT NULL CHECK (kind IN ('cron', 'interval', 'once')),
    spec          text   NOT NULL,
    next_run_at   bigint,
    last_run_at   bigint,
    last_status   text   CHECK (last_status IN ('ok', 'error', 'skipped')),
    fencing_token bigint NOT NULL DEFAULT 0 CHECK (fencing_token >= 0),
    lease_owner   text,
    lease_until   bigint,
    updated_at    bigint NOT NULL,
    consecutive_failures integer NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    catch_up      text   NOT NULL DEFAULT 'once' CHECK (catch_up IN ('skip', 'once', 'all')),
    paused        boolean NOT NULL DEFAULT false,
    jitter_ms     bigint NOT NULL DEFAULT 0 CHECK (jitter_ms BETWEEN 0 AND 86400000),
    triggered_at  bigint,
    due_at        bigint GENERATED ALWAYS AS (least(schedule_due_at(id, next_run_at, jitter_ms), triggered_at)) STORED
) WITH (fillfactor = 70);

COMMENT ON TABLE schedules IS
'Durable scheduled tasks (cron, interval, one-shot) with claim leases and '
'fencing tokens. Written only through the schedule_* functions.';
COMMENT ON COLUMN schedules.spec IS
'Cron expression (TZ=<zone> <cron> with a zone), interval ms or one-shot delay ms; opaque to the store.';
COMMENT ON COLUMN schedules.next_run_at IS
'Epoch ms of the next occurrence; NULL once a one-shot task has run (a tombstone).';
COMMENT ON COLUMN schedules.consecutive_failures IS
'How many completions in a row said last_status = ''error'': schedule_complete adds one '
'for an error and resets it to 0 for ''ok''. Kept by a re-register, 0 for a new id.';
COMMENT ON COLUMN schedules.last_status IS
'Outcome of the last occurrence: ok, error (the handler raised) or skipped (not run: '
'missed under catch_up = skip).';
COMMENT ON COLUMN schedules.catch_up IS
'What the scheduler does with occurrences missed while none ran: skip (none is run), '
'once (one run, then the future) or all (each, in order, up to the scheduler''s cap). '
'Kept by the store; applied by whoever computes next_run_at.';
COMMENT ON COLUMN schedules.paused IS
'Set by schedule_pause, cleared by schedule_resume: a paused schedule is never claimed '
'(a lease already held runs on). schedule_register leaves it as it is.';
COMMENT ON COLUMN schedules.jitter_ms IS
'Each occurrence becomes claimable a deterministic amount in [0, jitter_ms) after '
'next_run_at: schedule_due_at(id, next_run_at, jitter_ms). 0: no jitter.';
COMMENT ON COLUMN schedules.due_at IS
'When the schedule may be claimed next: the occurrence at next_run_at (the nominal time) '
'plus its jitter, schedule_due_at(id, next_run_at, jitter_ms), or a pending trigger''s '
'triggered_at when earlier. Generated: it cannot disagree. NULL for a tombstone with no '
'trigger. The claims compare it with now, so the claim path costs what it did.';
COMMENT ON COLUMN schedules.triggered_at IS
'Set by schedule_trigger: a run out of turn is asked for (the next claim takes it) or held '
'(the current claim is that run: its complete keeps next_run_at). NULL: none.';
COMMENT ON COLUMN schedules.fencing_token IS
'Bumped by every successful claim; never goes backwards for an id, even across delete and register.';

CREATE TABLE schedule_fences (
    id            text COLLATE "C" PRIMARY KEY,
    fencing_token bigint NOT NULL CHECK (fencing_token >= 0)
);

COMMENT ON TABLE schedule_fences IS
'The fencing-token high-water mark of every schedule id ever deleted; '
'schedule_register starts a re-registered id from it.';
