"""What ``start()`` decides, shared by every PostgreSQL store."""

from __future__ import annotations

from pgstore.errors import SchemaNotReady
from pgstore.schema.objects import HEAD_REVISION


def needs_migration(schema: str, revision: str | None, auto_migrate: bool) -> bool:
    """True when ``start()`` must migrate; raises ``SchemaNotReady`` when it may not."""
    if revision == HEAD_REVISION:
        return False
    if auto_migrate and (revision is None or revision < HEAD_REVISION):
        return True
    state = "has no pgstore objects" if revision is None else f"is at revision {revision}"
    if revision is not None and revision > HEAD_REVISION:
        advice = "upgrade the pgstore package"
    else:
        advice = (
            f"run `pgstore migrate --dsn DSN --schema {schema}`, or pgstore.migrate(), "
            "or construct the store with auto_migrate=True"
        )
    raise SchemaNotReady(
        f"schema {schema!r} {state}; this pgstore needs {HEAD_REVISION}: {advice}"
    )


def migrate(conninfo: str, schema: str) -> None:
    """Migrate to head (alembic is imported only when a store must migrate)."""
    from pgstore.schema.migrations import migrate as upgrade

    upgrade(conninfo, schema)
