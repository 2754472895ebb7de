"""How the suite spreads over pytest-xdist workers (``make test`` runs ``-n``).

Tests go to the workers one at a time, except that the tests of a module that use a
module-, class- or package-scoped fixture (a built wheel, a cluster of its own, a table
of 100,000 rows) all run on one worker, which builds the fixture once. A test may name a
group of its own with ``@pytest.mark.xdist_group("name")``: the tests of one group run
on one worker, one after the other.

xdist's own ``--dist loadgroup`` carries the group in the test's node id, which pytest
9.2 no longer lets a plugin change (the group is silently lost), so the groups travel
in a file instead: every worker writes the map of node id to group it computed at
collection (all workers collect the same tests, so they write the same map), and the
controller's scheduler reads it once every worker has collected.

``slow`` tests are collected first under xdist, so the long ones start early and none
is left running alone at the end; serial runs keep the files' order.

The hooks are the conftest's (``tests/conftest.py`` imports them).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

#: Where the controller tells its workers to write the groups (a file in a directory of
#: the controller's, removed at the end of the run).
GROUPS_FILE_VARIABLE = "PGSTORE_XDIST_GROUPS_FILE"

#: Fixture scopes wider than a test and narrower than the session (each worker has its
#: own session: a session-scoped fixture is built once per worker anyway).
SHARED_SCOPES = ("package", "module", "class")


def _is_controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))


def shared_fixture_group(item: pytest.Item) -> str | None:
    """The group of ``item``: the one its ``xdist_group`` mark names, else its module's
    when it uses a module-, class- or package-scoped fixture, else None."""
    mark = item.get_closest_marker("xdist_group")
    if mark is not None:
        return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        definitions = info.name2fixturedefs.get(name)
        if definitions and definitions[-1].scope in SHARED_SCOPES:
            return item.nodeid.split("::", 1)[0]
    return None


def pytest_configure(config: pytest.Config) -> None:
    """On the controller of an xdist run: a fresh file for the workers' groups."""
    if _is_controller(config):
        directory = tempfile.mkdtemp(prefix="pgstore-xdist-")
        config.add_cleanup(lambda: shutil.rmtree(directory, ignore_errors=True))
        os.environ[GROUPS_FILE_VARIABLE] = os.path.join(directory, "groups.json")


@pytest.hookimpl(trylast=True)  # after xdist's own hook: the node ids the controller sees
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a worker: write the groups, and collect the ``slow`` tests first."""
    if not hasattr(config, "workerinput"):
        return
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)  # stable
    groups = {}
    for item in items:
        group = shared_fixture_group(item)
        if group is not None:
            groups[item.nodeid] = "group:" + group
    path = os.environ.get(GROUPS_FILE_VARIABLE)
    if path:
        partial = f"{path}.{config.workerinput['workerid']}"
        Path(partial).write_text(json.dumps(groups))
        os.replace(partial, path)  # whole or not at all: the workers write alike


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's, which may not be installed
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The controller's scheduler: xdist's scope scheduling over these groups."""
    path = os.environ.get(GROUPS_FILE_VARIABLE)
    if config.getvalue("dist") != "loadgroup" or not path:
        return None
    groups_file = Path(path)
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """One unit of work per test, or per group."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:  # first called once every worker has collected
                self._groups = json.loads(groups_file.read_text())
            return self._groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)
