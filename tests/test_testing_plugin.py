"""The test-database layer itself: the server in use, and the testcontainers path."""

from __future__ import annotations

import psycopg
import pytest

from pgstore.testing import TestServer, _container, docker_engine_answers


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
