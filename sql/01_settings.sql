-- pgstore: the store's settings, which only its owner may change.
--
-- Not a custom GUC: any session may SET a placeholder variable such as
-- "pgstore.max_clock_skew_ms" (only an extension written in C can declare one
-- that needs a superuser), so a client could lift a bound read from one for
-- itself. A table that grants nothing to clients cannot be changed by them,
-- and the API functions read it as its owner (SECURITY DEFINER) on their
-- pinned search_path, so no temporary table of a client's stands in for it.

CREATE TABLE store_settings (
    singleton         boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    max_clock_skew_ms bigint CHECK (max_clock_skew_ms >= 0),
    default_max_attempts integer NOT NULL DEFAULT 25 CHECK (default_max_attempts > 0),
    max_lease_ms      bigint CHECK (max_lease_ms > 0),
    max_payload_bytes integer NOT NULL DEFAULT 65536 CHECK (max_payload_bytes > 0)
);

INSERT INTO store_settings DEFAULT VALUES;

COMMENT ON TABLE store_settings IS
'The store''s settings: one row, written by the owner with plain UPDATE. Clients '
'can neither read nor write it.';
COMMENT ON COLUMN store_settings.singleton IS
'Always true: the primary key that keeps the table to one row.';
COMMENT ON COLUMN store_settings.max_clock_skew_ms IS
'NULL (the default): off. Else every p_now that is not NULL must lie within this '
'many ms of now_ms(), or the call raises 22023 naming now and changes nothing.';
COMMENT ON COLUMN store_settings.default_max_attempts IS
'How many leases a job scheduled without p_max_attempts may have (25 unless the '
'owner changes it): job_schedule copies it into the new job''s max_attempts, so a '
'change applies to the jobs scheduled after it.';
COMMENT ON COLUMN store_settings.max_lease_ms IS
'The longest lease a call may set, in ms: p_lease_ms of schedule_claim_due and '
'schedule_claim_next, p_ttl_ms of job_lease, job_lease_many, job_renew and '
'job_renew_many, and p_lease_until - now_ms() of schedule_renew (a past '
'p_lease_until is allowed). Longer: 22023 naming the parameter, nothing changes. '
'NULL (the default): 86400000 (one day) while max_clock_skew_ms is set, else no bound.';

COMMENT ON COLUMN store_settings.max_payload_bytes IS
'The largest job payload job_schedule and job_schedule_many accept, in bytes of its '
'JSON text (64 KiB unless the owner changes it). Larger: 22023 naming payload '
'(payloads), nothing changes. Applies to payloads written after a change.';

CREATE FUNCTION check_now(p_now bigint) RETURNS bigint
LANGUAGE plpgsql
AS $$
-- Like the check_* helpers it runs as its caller, an API function: as the
-- store's owner, on that function's pinned search_path. The callers write
-- "CASE WHEN p_now IS NULL THEN now_ms() ELSE check_now(p_now) END": the
-- database-clock path never reads the table, and as a plpgsql assignment of
-- a plain expression it costs no query of its own beyond the one below.
DECLARE
    v_bound bigint;
    v_clock bigint;
BEGIN
    SELECT s.max_clock_skew_ms INTO v_bound FROM store_settings s;
    IF v_bound IS NOT NULL THEN
        v_clock := now_ms();
        -- numeric: p_now may be anywhere in bigint's range, so p_now - v_clock
        -- could overflow.
        IF abs(p_now::numeric - v_clock) > v_bound THEN
            PERFORM raise_invalid(format(
                'now must be within %s ms of the database clock (now - now_ms() = %s ms)',
                v_bound, p_now::numeric - v_clock));
        END IF;
    END IF;
    RETURN p_now;
END
$$;

COMMENT ON FUNCTION check_now(bigint) IS
'Returns p_now; raises 22023 naming now instead when store_settings.max_clock_skew_ms '
'is set and p_now is further than that from now_ms(). Called only for a p_now that '
'is not NULL.';

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
