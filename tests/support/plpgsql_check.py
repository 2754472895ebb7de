"""Static checks of every PL/pgSQL function in sql/ with the plpgsql_check extension.

    python tests/support/plpgsql_check.py [DSN]      (default: $PGSTORE_LINT_DSN, else the
                                              local PostgreSQL 15 on 127.0.0.1:5432)

Loads the current sql/ into a throwaway database on that server, runs
``plpgsql_check_function_tb`` with extra, performance and security warnings
on each function (on the search_path the API functions pin, the one their
helpers run on), prints every finding and exits 1 if there is any (or if
the server lacks the extension: Debian's ``postgresql-15-plpgsql-check``).
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from pgstore.testing import install_schema

DEFAULT_DSN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
SCHEMA = "pgstore"

CHECK = """
SELECT p.oid::regprocedure::text, r.level, r.message, r.lineno, r.statement, r.hint
  FROM pg_proc p
  JOIN pg_language l ON l.oid = p.prolang AND l.lanname = 'plpgsql'
 CROSS JOIN LATERAL public.plpgsql_check_function_tb(
           p.oid,
           fatal_errors => false,
           extra_warnings => true,
           performance_warnings => true,
           security_warnings => true) AS r
 WHERE p.pronamespace = %s::regnamespace
 ORDER BY 1, r.lineno
"""


def check(dsn: str) -> int:
    name = f"pgstore_lint_{uuid.uuid4().hex[:8]}"
    admin: psycopg.Connection[Any]
    with psycopg.connect(dsn, autocommit=True) as admin:
        available = admin.execute(
            "SELECT FROM pg_available_extensions WHERE name = 'plpgsql_check'"
        ).fetchone()
        if available is None:
            print("plpgsql_check is not installed on this server "
                  "(Debian: apt-get install postgresql-15-plpgsql-check)", file=sys.stderr)
            return 1
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        target = make_conninfo(dsn, dbname=name)
        install_schema(target, SCHEMA)
        conn: psycopg.Connection[Any]
        with psycopg.connect(target, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION plpgsql_check SCHEMA public")
            # The helpers (check_now) carry no SET clause: they run on the pinned
            # search_path of the API function that calls them, so check them on it.
            conn.execute(sql.SQL("SET search_path = {}, pg_temp").format(sql.Identifier(SCHEMA)))
            checked = conn.execute(
                "SELECT count(*) FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
                " WHERE l.lanname = 'plpgsql' AND p.pronamespace = %s::regnamespace", (SCHEMA,)
            ).fetchone()
            findings = conn.execute(CHECK, (SCHEMA,)).fetchall()
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
    for function, level, message, lineno, statement, hint in findings:
        print(f"{function}: {level}: line {lineno} ({statement}): {message}"
              + (f" (hint: {hint})" if hint else ""))
    count = checked[0] if checked else 0
    print(f"plpgsql_check: {count} functions, {len(findings)} findings")
    return 1 if findings or not count else 0


if __name__ == "__main__":
    sys.exit(check(sys.argv[1] if len(sys.argv) > 1 else os.environ.get(
        "PGSTORE_LINT_DSN", DEFAULT_DSN)))
