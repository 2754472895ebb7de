"""What a downgrade keeps for the upgrade back: ``downgrade_marks``.

A downgrade below ``pgstore_0007`` drops ``jobs.lease_sequence``. Upgraded again,
every job would start from 0, so the next lease of a job that had reached 3 would be
1: a worker still holding lease 1 of that job from before would pass the fence, and
a provider keyed on ``(run_id, lease_sequence)`` would drop the new send as a
duplicate. So the downgrade keeps the highest lease sequence the store handed out
(``KEEP_LEASE_SEQUENCE``) in ``downgrade_marks``, an owner-only table of the store's
schema, and the upgrade back lifts every job to at least it (``LIFT_LEASE_SEQUENCE``,
after the frozen ``0007`` script), deletes the mark, and drops the table once empty.
No mark is kept when no job was ever leased (nothing to protect), so a store that is
never downgraded never has the table. A downgrade below ``pgstore_0002`` drops the jobs
themselves, and forgets their mark with them (``FORGET_LEASE_SEQUENCE``): a job made
again after that starts from 1, as one made again after ``job_remove`` does. A
downgrade to ``base`` drops the table with the store.

A downgrade below ``pgstore_0003`` that keeps the client role because roles are members
of it records the role's OID here too (``keep_client_role``): the proof, which only the
store's owner can write, that lets the upgrade back adopt that role without being told
(``take_client_role``; see ``client_role.ensure_role``).

The table is trusted only when the migrating role owns it: one owned by anyone else
(made in a schema where others may create tables, such as ``public`` before
PostgreSQL 15) stops the migration with an error naming its owner. Both scripts are
plain SQL run with the schema first on ``search_path``, so offline mode (``--sql``)
prints them too.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import InvalidArgument
from pgstore.schema import objects as _schema

__all__ = [
    "DROP",
    "FORGET_LEASE_SEQUENCE",
    "KEEP_LEASE_SEQUENCE",
    "LIFT_LEASE_SEQUENCE",
    "TABLE",
    "keep_client_role",
    "take_client_role",
]

#: The table's name, in the store's schema.
TABLE = "downgrade_marks"

_OWNED = """
    IF (SELECT c.relowner FROM pg_class c
         WHERE c.oid = format('%I.downgrade_marks', current_schema())::regclass)
       IS DISTINCT FROM (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)
    THEN
        RAISE EXCEPTION USING
            ERRCODE = 'insufficient_privilege',
            MESSAGE = format('%I.downgrade_marks is owned by %s, not by the role migrating '
                             'the store (%s): pgstore does not trust it',
                             current_schema(),
                             (SELECT pg_get_userbyid(c.relowner) FROM pg_class c
                               WHERE c.oid = format('%I.downgrade_marks',
                                                    current_schema())::regclass),
                             current_user),
            HINT = 'Drop or rename that table, then migrate again.';
    END IF;
"""

_CREATE = """
    IF to_regclass(format('%I.downgrade_marks', current_schema())) IS NULL THEN
        CREATE TABLE downgrade_marks (
            mark text PRIMARY KEY,
            value bigint NOT NULL
        );
        COMMENT ON TABLE downgrade_marks IS
            'Kept by a pgstore downgrade for the upgrade back: jobs.lease_sequence, the '
            'highest lease sequence handed out (the upgrade that adds the column again '
            'lifts every job to at least it); client_role, the OID of the client role a '
            'downgrade below pgstore_0003 kept for its members (the upgrade adopts it). '
            'Owner-only; the upgrade deletes the marks it uses and drops the table once '
            'empty.';
        FOR v_grantee IN  -- default privileges may have granted something: take it back
            SELECT DISTINCT a.grantee FROM pg_class c, aclexplode(c.relacl) a
             WHERE c.oid = format('%I.downgrade_marks', current_schema())::regclass
               AND a.grantee <> c.relowner
        LOOP
            EXECUTE format('REVOKE ALL ON TABLE downgrade_marks FROM %s',
                           CASE WHEN v_grantee = 0 THEN 'PUBLIC'
                                ELSE quote_ident(pg_get_userbyid(v_grantee)) END);
        END LOOP;
    END IF;
"""

#: Run by the downgrade of ``pgstore_0007`` before its script drops the column.
KEEP_LEASE_SEQUENCE = (
    """
DO $keep$
DECLARE
    v_high bigint := (SELECT max(lease_sequence) FROM jobs);
    v_grantee oid;
BEGIN
    IF v_high IS NULL OR v_high = 0 THEN
        RETURN;  -- no job was ever leased: nothing can go backwards
    END IF;
"""
    + _CREATE
    + _OWNED
    + """
    INSERT INTO downgrade_marks AS m (mark, value) VALUES ('jobs.lease_sequence', v_high)
        ON CONFLICT (mark) DO UPDATE SET value = greatest(m.value, excluded.value);
END
$keep$;
"""
)

#: Run by the upgrade of ``pgstore_0007`` after its script added the column back.
LIFT_LEASE_SEQUENCE = (
    """
DO $lift$
DECLARE
    v_high bigint;
BEGIN
    IF to_regclass(format('%I.downgrade_marks', current_schema())) IS NULL THEN
        RETURN;  -- never downgraded below pgstore_0007 with leased jobs
    END IF;
"""
    + _OWNED
    + """
    DELETE FROM downgrade_marks WHERE mark = 'jobs.lease_sequence' RETURNING value INTO v_high;
    IF v_high IS NOT NULL THEN
        UPDATE jobs SET lease_sequence = v_high WHERE lease_sequence < v_high;
    END IF;
    IF NOT EXISTS (SELECT FROM downgrade_marks) THEN
        DROP TABLE downgrade_marks;
    END IF;
END
$lift$;
"""
)

#: Run by the downgrade of ``pgstore_0001`` (to ``base``): the marks go with the store
#: (a table of that name the migrating role does not own is left alone).
DROP = """
DO $drop$
BEGIN
    IF (SELECT c.relowner FROM pg_class c
         WHERE c.oid = to_regclass(format('%I.downgrade_marks', current_schema())))
       = (SELECT r.oid FROM pg_roles r WHERE r.rolname = current_user)
    THEN
        DROP TABLE downgrade_marks;
    END IF;
END
$drop$;
"""

#: Run by the downgrade of ``pgstore_0002``, which drops the jobs: their mark goes too.
FORGET_LEASE_SEQUENCE = (
    """
DO $forget$
BEGIN
    IF to_regclass(format('%I.downgrade_marks', current_schema())) IS NULL THEN
        RETURN;
    END IF;
"""
    + _OWNED
    + """
    DELETE FROM downgrade_marks WHERE mark = 'jobs.lease_sequence';
    IF NOT EXISTS (SELECT FROM downgrade_marks) THEN
        DROP TABLE downgrade_marks;
    END IF;
END
$forget$;
"""
)


def keep_client_role(conn: psycopg.Connection[Any], schema: str, role_oid: int) -> None:
    """Record that a downgrade below ``pgstore_0003`` kept the client role ``role_oid``
    of ``schema`` (creating the table if needed), in the caller's transaction."""
    script = (
        "DO $keep$\nDECLARE\n    v_grantee oid;\nBEGIN\n"
        + _CREATE
        + _OWNED
        + f"""
    INSERT INTO downgrade_marks AS m (mark, value) VALUES ('client_role', {int(role_oid)})
        ON CONFLICT (mark) DO UPDATE SET value = excluded.value;
END
$keep$;
"""
    )
    _schema.load(conn, schema, script)


def take_client_role(conn: psycopg.Connection[Any], schema: str, role_oid: int) -> bool:
    """Whether a downgrade of ``schema`` kept the client role ``role_oid`` (``keep_client_role``);
    if so, delete the mark (and the table once empty). ``InvalidArgument`` when the table
    is owned by another role than the current one."""
    table = sql.Identifier(schema, TABLE)
    row = conn.execute(
        "SELECT c.relowner = (SELECT oid FROM pg_roles WHERE rolname = current_user),"
        "       pg_get_userbyid(c.relowner)"
        "  FROM pg_class c WHERE c.oid = to_regclass(format('%%I.%%I', %s::text, %s::text))",
        (schema, TABLE),
    ).fetchone()
    if row is None:
        return False
    if not row[0]:
        raise InvalidArgument(
            f"{schema}.{TABLE} is owned by {row[1]}, not by the role migrating the store: "
            "pgstore does not trust it; drop or rename that table, then migrate again"
        )
    taken = conn.execute(
        sql.SQL("DELETE FROM {} WHERE mark = 'client_role' AND value = %s RETURNING 1").format(
            _schema.identifier_for_params(schema, TABLE)
        ),
        (role_oid,),
    ).fetchone()
    left = conn.execute(sql.SQL("SELECT EXISTS (SELECT FROM {})").format(table)).fetchone()
    if left is not None and not left[0]:
        conn.execute(sql.SQL("DROP TABLE {}").format(table))
    return taken is not None
