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
--
-- No function is named here. A fresh load of sql/ ends by revoking PUBLIC's
-- privileges on every function of the schema (pgstore/schema/files.py,
-- REVOKE_FROM_PUBLIC), and a revision that creates functions runs the same
-- statement (alembic_steps.revoke_from_public); the client role's grants are
-- read from pg_proc (pgstore/schema/catalog.py). A new function's signature is
-- written once, where it is created.

REVOKE ALL ON TABLE schedules, schedule_fences, jobs, store_settings, job_fences, store_epoch,
    job_history FROM PUBLIC;
