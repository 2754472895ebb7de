-- pgstore: who may do what.
--
-- The API functions run as their owner (SECURITY DEFINER, declared on each
-- function) with search_path pinned to "<schema>, pg_temp", so a caller's
-- own schemas and temporary objects can never stand in for the store's. No
-- one but the owner may execute anything or touch the tables directly: the
-- migration grants EXECUTE on the API functions (not the check_* helpers) and
-- USAGE on the schema to the client role "<schema>_client_<database>" (made
-- by pgstore/schema/client_role.py); the tables grant nothing to clients, so only
-- the owner can change store_settings (the bounds on p_now and on leases) and
-- job_fences.
--
-- Run migrations as a dedicated owner role, not a superuser: the functions
-- run with the owner's rights.

REVOKE ALL ON FUNCTION schema_revision() FROM PUBLIC;
REVOKE ALL ON FUNCTION now_ms() FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_get(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_register(text, text, text, bigint, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_claim_due(text, text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_renew(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_complete(text, bigint, bigint, bigint, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_delete(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_list() FROM PUBLIC;
REVOKE ALL ON FUNCTION schedule_claim_next(text, bigint, bigint, integer, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_channel() FROM PUBLIC;
REVOKE ALL ON FUNCTION job_schedule(text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_lease(text, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_renew(text, text, bigint, bigint, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_mark_dispatched(text, text, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_release(text, text, bigint, bigint, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_retry(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_cancel(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_get(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_list_dispatched() FROM PUBLIC;
REVOKE ALL ON FUNCTION job_remove(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_purge(bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_schedule_many(text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_lease_many(text, bigint, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_mark_dispatched_many(text[], text, text[], bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_renew_many(text[], text, bigint, bigint, bigint[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION store_stats(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_list(text, bigint, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION job_history_advance() FROM PUBLIC;
REVOKE ALL ON FUNCTION job_history_forget(bigint[], boolean[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_name(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_positive(text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_present(text, anyelement) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_one_of(text, text, text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_length(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_now(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_lease(bigint, text, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION raise_invalid(text) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_sequence(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_primary() FROM PUBLIC;
REVOKE ALL ON FUNCTION raise_standby() FROM PUBLIC;
REVOKE ALL ON FUNCTION token_floor() FROM PUBLIC;
REVOKE ALL ON FUNCTION token_floor_at(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION raise_no_epoch() FROM PUBLIC;
REVOKE ALL ON FUNCTION fence_after_restore(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION batch_max() FROM PUBLIC;
REVOKE ALL ON FUNCTION check_run_ids(text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_same_length(text, anyarray, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION check_lease_sequences(bigint[], integer) FROM PUBLIC;

REVOKE ALL ON TABLE schedules, schedule_fences, jobs, store_settings, job_fences, store_epoch,
    job_history FROM PUBLIC;
