"""``pgstore web [--dsn DSN] [--schema NAME] [--host ADDR] [--port N]``: the console.

Serves ``pgstore.web`` (the on-call console: overview, jobs, failed jobs, leases,
schedules, workers; docs/console.md) until SIGINT or SIGTERM, on 127.0.0.1 unless
``--host`` asks for another address. It needs the ``web`` extra (Starlette, Jinja2,
uvicorn), imported only when the command runs: ``pgstore`` without the extra works,
and ``pgstore web`` then says what to install. The schema is checked first, on a
connection of its own (``SchemaNotReady`` says what to run), before anything listens.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

from pgstore.errors import PgStoreError

__all__ = ["add_command"]

#: The packages of the ``web`` extra.
WEB_PACKAGES = ("starlette", "jinja2", "uvicorn", "markupsafe")


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"not a port (0 to 65535): {text!r}")
    return value


def _cmd_web(args: argparse.Namespace) -> int:
    try:
        from pgstore.web.app import serve
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing not in WEB_PACKAGES:
            raise
        raise PgStoreError(
            f"pgstore web needs the web extra ({missing} is missing): "
            "pip install 'pgstore[web]'"
        ) from None
    from pgstore.postgres.jobs import PgJobStore

    conn: psycopg.Connection[Any]
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        PgJobStore(conn, schema=args.schema).start()  # SchemaNotReady, saying what to run
    serve(args.dsn, args.schema, args.host, args.port)
    return 0


def add_command(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``web`` among ``commands`` (the parser's subparsers), with the common
    ``--dsn`` and ``--schema`` of ``common``."""
    web = commands.add_parser(
        "web",
        parents=[common],
        help="serve the on-call console (the web extra) on 127.0.0.1",
        description=(
            "Serve the on-call console: overview (jobs per state, the oldest due job's lag, "
            "dispatches and lateness over the last hour), jobs, failed jobs, leases in "
            "flight, schedules and workers, read through the store's SQL functions. It "
            "offers a failed job's retry, a job's cancel and a schedule's delete only when "
            "the connected role may execute those functions: a monitoring role sees a "
            "read-only console. Needs the web extra: pip install 'pgstore[web]'."
        ),
    )
    web.add_argument(
        "--host",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address to listen on (default: 127.0.0.1, this host only; another serves "
        "the console without any login: put it behind a proxy that authenticates)",
    )
    web.add_argument(
        "--port", type=_port, default=8765, metavar="N",
        help="the port (default: 8765; 0: any free port, printed)",
    )
    web.set_defaults(run=_cmd_web)
