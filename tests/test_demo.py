"""``make demo`` runs the demo module; here it runs on the test server and must pass its own check."""

from __future__ import annotations

import pytest

from pgstore import demo


def test_demo_passes_its_checks(pgstore_database: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSTORE_DSN", pgstore_database)
    assert demo.main() == 0
