-- pgstore: shared helpers.
--
-- Every file in sql/ is loaded with search_path set to "<schema>, pg_temp",
-- and every API function pins that path with SET search_path FROM CURRENT,
-- so no schema name appears in any body: the schema is chosen at migration
-- time. The helpers that API functions inline (now_ms, check_*) run on that
-- pinned path too, as part of their caller.

-- The revision is named in one place, the newest revision module in
-- migrations/versions/: the loader (pgstore.schema.files.current_schema_sql)
-- follows these files with a CREATE OR REPLACE of schema_revision() returning
-- it, and each revision sets its own (alembic_steps.set_schema_revision). The
-- body below is what a load of these files alone answers: no revision.
CREATE FUNCTION schema_revision() RETURNS text
LANGUAGE sql IMMUTABLE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$ SELECT NULL::text $$;

COMMENT ON FUNCTION schema_revision() IS
'The migration revision this schema''s objects were built by. The Python '
'stores compare it with their migration head at start().';

CREATE FUNCTION now_ms() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

COMMENT ON FUNCTION now_ms() IS
'The database clock (clock_timestamp()) in epoch milliseconds. Every p_now '
'argument that is NULL means this value, so callers on many hosts share one clock.';

-- The helpers below, like now_ms(), are plain LANGUAGE sql functions with no
-- SECURITY DEFINER and no SET clause: that is what lets the planner inline
-- them into the expressions of the API functions that call them (about 10 µs
-- a call each, otherwise). They read no table and run as their caller, so
-- they need neither: inside the API functions the search_path is the API
-- function's pinned one, and nobody else may execute them (see 90_privileges).

CREATE FUNCTION raise_invalid(p_message text) RETURNS void
LANGUAGE plpgsql
AS $$
-- VOLATILE on purpose, though it reads nothing: the planner may evaluate an
-- IMMUTABLE call with constant arguments while planning, even in a CASE
-- branch that never runs, and so raise for valid input.
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'invalid_parameter_value', MESSAGE = p_message;
END
$$;

COMMENT ON FUNCTION raise_invalid(text) IS
'Raises 22023 (invalid_parameter_value) with p_message; what every check_* calls on bad input.';

CREATE FUNCTION check_name(p_param text, p_value text) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value IS NULL OR p_value = '' OR length(p_value) > 1024
                THEN raise_invalid(format(
                         '%s must be a non-empty string of at most 1024 characters', p_param))
           END
$$;

COMMENT ON FUNCTION check_name(text, text) IS
'Raises 22023 naming p_param unless p_value is a non-empty string of at most '
'1024 characters (ids, owners, holders, worker ids).';

CREATE FUNCTION check_length(p_param text, p_value text) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN length(p_value) > 1024
                THEN raise_invalid(format(
                         '%s must be a string of at most 1024 characters', p_param))
           END
$$;

COMMENT ON FUNCTION check_length(text, text) IS
'Raises 22023 naming p_param when p_value is longer than 1024 characters; NULL '
'and the empty string pass (check_present rejects NULL). A schedule''s spec.';

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

CREATE FUNCTION check_positive(p_param text, p_value bigint) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value IS NULL OR p_value <= 0
                THEN raise_invalid(format('%s must be a positive integer', p_param))
           END
$$;

COMMENT ON FUNCTION check_positive(text, bigint) IS
'Raises 22023 naming p_param unless p_value is a positive integer '
'(lease_ms, ttl_ms, limit).';

CREATE FUNCTION check_present(p_param text, p_value anyelement) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value IS NULL
                THEN raise_invalid(format('%s must not be null', p_param))
           END
$$;

COMMENT ON FUNCTION check_present(text, anyelement) IS
'Raises 22023 naming p_param when p_value is NULL.';

CREATE FUNCTION check_one_of(p_param text, p_value text, p_allowed text[]) RETURNS void
LANGUAGE sql
AS $$
    SELECT CASE WHEN p_value IS NULL OR NOT p_value = ANY (p_allowed)
                THEN raise_invalid(format(
                         '%s must be one of %s', p_param, array_to_string(p_allowed, ', ')))
           END
$$;

COMMENT ON FUNCTION check_one_of(text, text, text[]) IS
'Raises 22023 naming p_param unless p_value is one of p_allowed (kind, last_status).';

-- Failover and restores. A promoted standby has not replayed the commits its
-- old primary acknowledged last, so a counter it bumps could hand out a token
-- (or lease sequence) a holder already has. Every promotion starts a new
-- timeline, and the server's timeline ID can be read by any role, so the
-- counters are lifted to at least token_floor() at every write:
-- 2^40 * (timeline - 1 + epoch). A timeline, or an epoch, is a band of 2^40
-- tokens: after a promotion the first claim of an id jumps above everything
-- the old timeline can have issued for it, as long as it issued fewer than
-- 2^40 (about 10^12) for that id. A bigint holds 2^23 bands; JavaScript's
-- numbers are exact up to 2^53, the first 2^13.
--
-- A restore that stays on the old timeline (a base backup or volume
-- snapshot started as a primary, a pg_dump restored into a new cluster, a
-- logical replica switched to) or a second standby promoted onto the
-- timeline of one that died gets no new timeline: store_epoch.epoch is what
-- the owner lifts then, with fence_after_restore() (40_restore.sql),
-- before any worker connects. On timeline 1 with epoch 0 the floor is 0 and
-- nothing changes.

CREATE TABLE store_epoch (
    singleton    boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    epoch        bigint  NOT NULL DEFAULT 0 CHECK (epoch >= 0),
    fenced_at    bigint,
    floor_before bigint,
    floor_after  bigint
);

INSERT INTO store_epoch DEFAULT VALUES;

COMMENT ON TABLE store_epoch IS
'The bands of 2^40 tokens token_floor() adds to the timeline''s: one row, written '
'only by fence_after_restore(). Clients can neither read nor write it; its row '
'must never be deleted (every claim and lease then fails).';
COMMENT ON COLUMN store_epoch.singleton IS
'Always true: the primary key that keeps the table to one row.';
COMMENT ON COLUMN store_epoch.epoch IS
'Bands added to the timeline''s: token_floor() = 2^40 * (timeline - 1 + epoch). 0 '
'until the first fence_after_restore(); it only grows.';
COMMENT ON COLUMN store_epoch.fenced_at IS
'Epoch ms (database clock) of the last fence_after_restore(); NULL: never fenced.';
COMMENT ON COLUMN store_epoch.floor_before IS
'token_floor() just before the last fence_after_restore(); NULL: never fenced.';
COMMENT ON COLUMN store_epoch.floor_after IS
'token_floor() the last fence_after_restore() set (on the timeline it ran on); '
'NULL: never fenced.';

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

CREATE FUNCTION raise_no_epoch() RETURNS bigint
LANGUAGE plpgsql
AS $$
-- @plpgsql_check_options: performance_warnings = false
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = 'object_not_in_prerequisite_state',
        MESSAGE = 'store_epoch has no row: no fencing token or lease sequence can be handed out',
        HINT = 'Insert it back (INSERT INTO store_epoch DEFAULT VALUES) and run '
               'pgstore fence --after-restore before any worker connects.';
END
$$;

COMMENT ON FUNCTION raise_no_epoch() IS
'Raises 55000 (object_not_in_prerequisite_state) saying store_epoch lost its row; '
'what token_floor_at calls for a NULL epoch, so no write hands out a token below '
'the floor.';

CREATE FUNCTION token_floor_at(p_epoch bigint) RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    -- The first 8 hex digits of a WAL file name are its timeline ID. The
    -- product (not a shift, which wraps) raises 22003 beyond band 2^23.
    -- p_epoch appears once, so a caller's (SELECT e.epoch FROM store_epoch e)
    -- stays inlined: the planner runs it once per statement (an InitPlan).
    SELECT (('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint - 1
            + coalesce(p_epoch, raise_no_epoch()))
           * 1099511627776
$$;

COMMENT ON FUNCTION token_floor_at(bigint) IS
'2^40 * (the server''s timeline ID - 1 + p_epoch); raises 55000 for a NULL p_epoch '
'(store_epoch lost its row). The writes call it as '
'token_floor_at((SELECT e.epoch FROM store_epoch e)): inlined, one read of '
'store_epoch per statement. Only on a primary: check_primary first.';

CREATE FUNCTION token_floor() RETURNS bigint
LANGUAGE sql VOLATILE
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
    SELECT token_floor_at((SELECT e.epoch FROM store_epoch e))
$$;

COMMENT ON FUNCTION token_floor() IS
'2^40 * (the server''s timeline ID - 1 + store_epoch.epoch): the least fencing token '
'and lease sequence a write may hand out, so none goes backwards across a promotion '
'or, once fence_after_restore() has run, a restore (0 on timeline 1 before any '
'fence). The owner''s reading (not granted to the client role); the writes compute '
'it inline with token_floor_at. Only on a primary.';
