-- pgstore: the schedule store's tables.
--
-- Storage is chosen for the claim path, which updates the same rows all day:
-- fillfactor 70 leaves room on each page for the new row version, and the
-- only index is the primary key, so claim, renew and complete never change an
-- indexed column and stay HOT (heap-only) updates. schedule_claim_next with
-- p_ids probes the primary key; without p_ids it scans the table, which is
-- the price of keeping every update HOT (see README, "Storage").

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
    catch_up      text   NOT NULL DEFAULT 'once' CHECK (catch_up IN ('skip', 'once', 'all'))
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
COMMENT ON COLUMN schedules.fencing_token IS
'Bumped by every successful claim; never goes backwards for an id, even across delete and register.';

CREATE TABLE schedule_fences (
    id            text COLLATE "C" PRIMARY KEY,
    fencing_token bigint NOT NULL CHECK (fencing_token >= 0)
);

COMMENT ON TABLE schedule_fences IS
'The fencing-token high-water mark of every schedule id ever deleted; '
'schedule_register starts a re-registered id from it.';
