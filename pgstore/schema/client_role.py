"""The client role: a NOLOGIN role that may use one store's schema and execute its API
functions, nothing else.

Every statement here is composed with ``psycopg.sql`` (names quoted as identifiers,
comments as literals) and executed on its own: no schema or role name is ever spliced
into the text of a script or a comment. A role's scope is one schema in one database:
pgstore marks the roles it creates (their ``COMMENT``) with both, and adopts an
existing role only when that mark matches, the role cannot log in, and something only
the store's owner can write proves that pgstore made it for this store, unless the
caller says to adopt it anyway.

The comment alone proves nothing: any role with CREATEROLE can create a role of the
default name, copy pgstore's comment onto it and (PostgreSQL 16 and later) make
itself a member, before the first migration. The proof is one of: the role already
holds EXECUTE on a function of this schema granted by the function's owner (what
every migration since the role was created has granted it, and what only the owner,
or a superuser, can grant), or the mark a downgrade below ``pgstore_0003`` kept in the
owner-only ``downgrade_marks`` table when it kept the role for its members
(``pgstore.schema.marks``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgstore.errors import InvalidArgument
from pgstore.schema import catalog as _catalog
from pgstore.schema import marks as _marks
from pgstore.schema.function import Function
from pgstore.schema.objects import check_name

log = logging.getLogger("pgstore.migrate")

#: How pgstore before the database-scoped names marked its roles (``<schema>_client``).
LEGACY_COMMENT = "pgstore client role: may call the store's functions in schema {}"

#: What every comment pgstore puts on a role begins with.
COMMENT_PREFIX = "pgstore client role:"

ADOPT_ADVICE = (
    "name another role (client_role=NAME, --client-role NAME, -x client_role=NAME), or, "
    "if this role is meant to be shared, adopt it explicitly (client_role_adopt=True, "
    "--adopt-client-role, -x adopt_client_role=true)"
)


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def database_mark(database: str) -> str:
    """How the comment of a role pgstore created for ``database`` ends."""
    return f" of database {_quoted(database)}"


def role_comment(schema: str, database: str) -> str:
    """The comment that marks a role pgstore created for ``schema`` in ``database``
    (names quoted as identifiers, so no two pairs give the same text)."""
    return (
        f"{COMMENT_PREFIX} may call the store's functions in schema {_quoted(schema)}"
        + database_mark(database)
    )


def default_name(schema: str, database: str) -> str:
    """The default client role of ``schema`` in ``database``: ``<schema>_client_<database>``
    (roles are cluster-wide, so the database is part of the name)."""
    role = f"{schema}_client_{database}"
    if len(role.encode()) > 63:
        raise InvalidArgument(
            f"the default client role name {role!r} is longer than 63 bytes: "
            "name one (client_role=NAME, --client-role NAME, -x client_role=NAME)"
        )
    return check_name(role, "client role")


def legacy_name(schema: str) -> str:
    """The default name older pgstore gave the client role: ``<schema>_client``."""
    return f"{schema}_client"


@dataclass(frozen=True)
class _Role:
    can_login: bool
    superuser: bool
    comment: str | None
    members: int
    oid: int
    member_names: tuple[str, ...]


def _read(conn: psycopg.Connection[Any], role: str) -> _Role | None:
    row = conn.execute(
        "SELECT rolcanlogin, rolsuper, shobj_description(oid, 'pg_authid'),"
        "       (SELECT count(*) FROM pg_auth_members m WHERE m.roleid = r.oid), oid,"
        "       ARRAY(SELECT pg_get_userbyid(m.member) FROM pg_auth_members m"
        "              WHERE m.roleid = r.oid ORDER BY 1)"
        "  FROM pg_roles r WHERE rolname = %s",
        (role,),
    ).fetchone()
    if row is None:
        return None
    return _Role(bool(row[0]), bool(row[1]), row[2], int(row[3]), int(row[4]), tuple(row[5]))


def _granted_by_the_owner(conn: psycopg.Connection[Any], schema: str, role_oid: int) -> bool:
    """Whether ``role_oid`` holds a privilege on a function of ``schema`` that the
    function's owner granted: what only the store's owner (or a superuser) can write."""
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM pg_proc p, aclexplode(p.proacl) a"
        "  WHERE p.pronamespace = (SELECT oid FROM pg_namespace WHERE nspname = %s)"
        "    AND a.grantee = %s AND a.grantor = p.proowner)",
        (schema, role_oid),
    ).fetchone()
    return bool(row and row[0])


def current_database(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute("SELECT current_database()").fetchone()
    assert row is not None
    return str(row[0])


def _check_adoptable(role: str, found: _Role, schema: str, database: str) -> None:
    if found.can_login or found.superuser:
        what = "is a superuser" if found.superuser else "can log in"
        raise InvalidArgument(
            f"client role {role!r} already exists and {what}: pgstore grants a store's "
            f"functions only to a NOLOGIN role it created; {ADOPT_ADVICE}"
        )
    if found.comment != role_comment(schema, database):
        raise InvalidArgument(
            f"client role {role!r} already exists and pgstore did not create it for schema "
            f"{schema!r} in database {database!r} (another database or schema may use it); "
            f"{ADOPT_ADVICE}"
        )


def _check_proof(
    conn: psycopg.Connection[Any], role: str, found: _Role, schema: str, database: str
) -> None:
    if _granted_by_the_owner(conn, schema, found.oid):
        return
    if _marks.take_client_role(conn, schema, found.oid):
        return
    members = f" (members: {', '.join(found.member_names)})" if found.member_names else ""
    raise InvalidArgument(
        f"client role {role!r} already exists{members} and nothing only the owner of schema "
        f"{schema!r} in database {database!r} can write shows that pgstore created it for "
        "this store (its comment can be written by any role with CREATEROLE, which could "
        f"have made the role to be granted the store's functions); {ADOPT_ADVICE}"
    )


def _warn_adopted(role: str, found: _Role, schema: str) -> None:
    if found.member_names:
        log.warning(
            "pgstore: adopting existing client role %r for schema %r as told: its members "
            "(%s) may now call the store's functions; check that each of them should.",
            role,
            schema,
            ", ".join(found.member_names),
        )


def ensure_role(conn: psycopg.Connection[Any], schema: str, role: str, adopt: bool) -> None:
    """Create the NOLOGIN ``role``, marked as this schema's in this database, or check that
    the existing one may be adopted: its comment marks it as this schema's in this
    database, it cannot log in, and the store's owner granted it before (or a downgrade
    kept it; see the module's docstring). ``adopt``: any existing role is, with a warning
    naming its members. Raises ``InvalidArgument`` naming the role and what to do when it
    may not.

    Safe against a concurrent migration of another database creating the same role: the
    ``CREATE ROLE`` runs in a savepoint, and on a duplicate the role is read again and
    judged like any existing one."""
    check_name(role, "client role")
    database = current_database(conn)
    found = _read(conn, role)
    if found is None:
        try:
            with conn.transaction():
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(role)))
                conn.execute(
                    sql.SQL("COMMENT ON ROLE {} IS {}").format(
                        sql.Identifier(role), sql.Literal(role_comment(schema, database))
                    )
                )
            return
        except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
            found = _read(conn, role)  # created meanwhile by a migration elsewhere
            if found is None:
                raise
    if adopt:
        if not _granted_by_the_owner(conn, schema, found.oid):  # adopted by this call
            _warn_adopted(role, found, schema)
        return
    _check_adoptable(role, found, schema, database)
    _check_proof(conn, role, found, schema, database)


def _signature(schema: str, function: Function) -> sql.Composed:
    """``"schema"."name"(type, ...)``: the function as GRANT and regprocedure name it."""
    return sql.SQL("{}.{}({})").format(
        sql.Identifier(schema),
        sql.Identifier(function.name),
        sql.SQL(", ").join(sql.SQL(t) for t in function.arg_types),
    )


def _grant_execute(schema: str, function: Function, role: str) -> sql.Composed:
    return sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(
        _signature(schema, function), sql.Identifier(role)
    )


def grant_statements(
    schema: str, role: str, functions: Sequence[Function]
) -> list[sql.Composed]:
    """One ``GRANT`` per statement: USAGE on ``schema``, then EXECUTE on each function."""
    usage = sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(
        sql.Identifier(schema), sql.Identifier(role)
    )
    return [usage, *(_grant_execute(schema, function, role) for function in functions)]


def executors(conn: psycopg.Connection[Any], schema: str, function: Function) -> list[str]:
    """The roles granted EXECUTE on ``function`` of ``schema``, other than its owner and
    PUBLIC (none when the function does not exist)."""
    signature = _signature(schema, function)
    rows = conn.execute(
        sql.SQL(
            "SELECT DISTINCT pg_get_userbyid(a.grantee)"
            "  FROM pg_proc p, aclexplode(p.proacl) a"
            " WHERE p.oid = to_regprocedure({})"
            "   AND a.privilege_type = 'EXECUTE' AND a.grantee <> 0 AND a.grantee <> p.proowner"
            " ORDER BY 1"
        ).format(sql.Literal(signature.as_string(conn)))
    ).fetchall()
    return [str(row[0]) for row in rows]


def grant_executors(
    conn: psycopg.Connection[Any], schema: str, function: Function, roles: Sequence[str]
) -> None:
    """Grant EXECUTE on ``function`` of ``schema`` to each of ``roles``, one statement each."""
    for role in roles:
        conn.execute(_grant_execute(schema, function, role))


def grant(
    conn: psycopg.Connection[Any],
    schema: str,
    role: str,
    functions: Sequence[Function] | None = None,
    adopt: bool = False,
) -> None:
    """Create (or adopt, see ``ensure_role``) ``role`` and grant it USAGE on ``schema``
    and EXECUTE on ``functions``, in the caller's transaction. ``functions`` None: the
    client functions ``pg_proc`` has in ``schema`` now (``catalog.client_functions``),
    what a fresh load of sql/ and a revision without a frozen list grant."""
    if functions is None:
        functions = _catalog.client_functions(_catalog.definitions(conn, schema))
    ensure_role(conn, schema, role, adopt)
    for statement in grant_statements(schema, role, functions):
        conn.execute(statement)


def find_for_downgrade(conn: psycopg.Connection[Any], schema: str) -> str | None:
    """The default client role of ``schema`` here, for a downgrade: the database-scoped
    name if such a role exists, else the ``<schema>_client`` an older pgstore created for
    this schema (its comment says so), else None."""
    try:
        role: str | None = default_name(schema, current_database(conn))
    except InvalidArgument:
        role = None  # too long to be a default: the legacy name may still be there
    if role is not None and _read(conn, role) is not None:
        return role
    legacy = legacy_name(schema)
    found = _read(conn, legacy)
    if found is not None and found.comment == LEGACY_COMMENT.format(schema):
        return legacy
    return None


def revoke(conn: psycopg.Connection[Any], schema: str, role: str) -> None:
    """Take back what ``grant`` gave in ``schema``, then drop the role if pgstore created
    it for this schema (in this database, or by an older pgstore), no role is a member of
    it, and nothing else (another database's grants) still needs it. A role with members
    is kept, and a warning says so: dropping it would silently drop those memberships.
    A role pgstore created and keeps is recorded in the store's owner-only
    ``downgrade_marks`` (``marks.keep_client_role``), so the next upgrade adopts it again."""
    found = _read(conn, role)
    if found is None:
        return
    database = current_database(conn)
    who, nsp = sql.Identifier(role), sql.Identifier(schema)
    conn.execute(sql.SQL("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {} FROM {}").format(nsp, who))
    conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM {}").format(nsp, who))
    if found.comment not in (role_comment(schema, database), LEGACY_COMMENT.format(schema)):
        return
    if found.members:
        _marks.keep_client_role(conn, schema, found.oid)  # the proof, for the upgrade back
        log.warning(
            "pgstore: keeping client role %r: %d role(s) are members of it; its privileges "
            "in schema %r are revoked, and upgrading the schema again adopts it. DROP ROLE "
            "it yourself if it is no longer wanted.",
            role,
            found.members,
            schema,
        )
        return
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP ROLE {}").format(who))
    except psycopg.errors.DependentObjectsStillExist:
        # Still granted something elsewhere (another schema or database): keep it, and
        # the proof that it is this store's, for the upgrade back.
        _marks.keep_client_role(conn, schema, found.oid)
