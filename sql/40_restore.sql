-- pgstore: fencing after a restore, what only the owner runs.
--
-- token_floor() covers a promotion, which starts a new timeline. A restore
-- that stays on the old timeline does not: a base backup or volume snapshot
-- started as a primary, a pg_dump restored into a new cluster, a logical
-- replica switched to, or a second standby promoted onto the timeline of one
-- that died. Each holds the counters as they were when the copy was taken, so
-- without a fence its claims and leases hand out again the tokens and lease
-- sequences the lost server acknowledged after that. fence_after_restore()
-- lifts store_epoch.epoch above all of them; the owner runs it on the
-- restored server before any worker connects (pgstore fence --after-restore).

CREATE FUNCTION fence_after_restore(p_promotions integer DEFAULT 1)
RETURNS TABLE (floor_before bigint, floor_after bigint)
LANGUAGE plpgsql
SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    v_epoch   bigint;
    v_before  bigint;
    v_highest bigint;
    v_band    bigint;
BEGIN
    PERFORM check_primary();
    IF p_promotions IS NULL OR p_promotions < 0 OR p_promotions > 1024 THEN
        PERFORM raise_invalid('promotions must be an integer from 0 to 1024');
    END IF;

    -- One fence at a time: a second one waits for this row, then (under READ
    -- COMMITTED) reads the epoch the first wrote and lifts above it again.
    SELECT e.epoch INTO v_epoch FROM store_epoch e FOR UPDATE;
    v_before := token_floor_at(v_epoch);  -- 55000 when the row is missing

    -- M: the highest token and lease sequence this copy holds, and its floor.
    -- Every table that keeps a counter's value or high-water mark is one more
    -- argument of this greatest(), after the last one (and in the COMMENT).
    SELECT greatest(v_before,
                    (SELECT max(s.fencing_token) FROM schedules s),
                    (SELECT max(f.fencing_token) FROM schedule_fences f),
                    (SELECT max(j.lease_sequence) FROM jobs j),
                    (SELECT f.lease_sequence FROM job_fences f))
      INTO v_highest;

    -- The lost server handed out fewer than 2^40 per id in M's band, and in
    -- each band its promotions after the copy added: the new floor starts the
    -- band after all of those. Overflow (band 2^23) raises 22003.
    v_band := v_highest / 1099511627776 + 1 + p_promotions;
    UPDATE store_epoch e
       SET epoch = v_band - (v_before / 1099511627776 - v_epoch),  -- minus the timeline's bands
           fenced_at = now_ms(),
           floor_before = v_before,
           floor_after = v_band * 1099511627776;

    RETURN QUERY SELECT v_before, token_floor_at((SELECT e.epoch FROM store_epoch e));
END
$$;

COMMENT ON FUNCTION fence_after_restore(integer) IS
'Run on a restored server before any worker connects: lifts store_epoch.epoch so '
'that token_floor() becomes 2^40 * (M div 2^40 + 1 + p_promotions), where M is the '
'greatest of every schedules.fencing_token, schedule_fences.fencing_token, '
'jobs.lease_sequence, job_fences.lease_sequence and the current token_floor(). Every later claim and lease then '
'hands out more than any the lost server can have, if it handed out fewer than '
'2^40 per id per band and went through at most p_promotions promotions (or fences) '
'that the copy does not show: those after the copy, and for a pg_dump or logical '
'copy (no timeline carried) those since which it handed out nothing. The epoch only '
'grows: each call lifts again, using '
'1 + p_promotions bands or more of the 2^23 a bigint holds (2^13 below 2^53). '
'Returns the floor before and after. 25006 on a standby; 22023 unless '
'p_promotions is 0 to 1024. Owner only: not granted to the client role.';
