"""The test-database layer itself: the server in use, and the testcontainers path."""

from __future__ import annotations

import psycopg
import pytest

from pgstore.testing import (
    TEST_DSN_VARIABLE,
    THROWAWAY_SETTINGS,
    TestServer,
    _container,
    docker_engine_answers,
)


def test_the_session_server_answers(pgstore_server: TestServer) -> None:
    assert pgstore_server.version >= 150000
    with psycopg.connect(pgstore_server.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_testcontainers_path_where_a_docker_engine_answers() -> None:
    if not docker_engine_answers():
        pytest.skip("no Docker engine answers here (the docker client alone is not enough)")
    with _container() as dsn, psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
        assert row is not None and row[0] >= 180000


def test_a_server_started_for_the_tests_runs_without_fsync(pgstore_server: TestServer) -> None:
    """The embedded (or container) server skips fsync and the commit's WAL flush; a server
    named by PGSTORE_TEST_DSN is left as its owner set it."""
    if pgstore_server.origin == TEST_DSN_VARIABLE:
        pytest.skip("PGSTORE_TEST_DSN: a server of its owner's, not changed")
    with psycopg.connect(pgstore_server.dsn) as conn:
        for name, value in THROWAWAY_SETTINGS.items():
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            assert row == (value,), name
