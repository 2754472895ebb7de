"""The sync modules are what ``make generate`` writes from their asyncio sources.

``tools/async_to_sync.py`` is run into a temporary directory and each sync module
it writes must be the committed one, byte for byte: a sync module edited by hand, or
an asyncio source edited without ``make generate``, fails here. And the generator
itself: its rewrites (``async``/``await`` gone, names renamed, ``# ASYNC`` blocks)
on a source of its own.
"""

from __future__ import annotations

import difflib
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "async_to_sync.py"


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", TOOL)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_sync_module_is_the_generated_one(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(TOOL), "--out-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sources = _tool().SOURCES
    assert len(sources) >= 5, sources
    stale = []
    for source in sources:
        target = _tool().sync_module_path(source)
        made = (tmp_path / target).read_text(encoding="utf-8")
        committed = (ROOT / target).read_text(encoding="utf-8")
        assert made.startswith(f"# generated from {source} by tools/async_to_sync.py;\n")
        if made != committed:
            stale.append("".join(difflib.unified_diff(
                committed.splitlines(keepends=True), made.splitlines(keepends=True),
                f"{target} (committed)", f"{target} (generated)",
            )))
    assert not stale, (
        "sync modules differ from what their asyncio sources make: run `make generate` "
        "(python tools/async_to_sync.py) and commit the result\n" + "\n".join(stale)
    )


SOURCE = '''"""A store, for asyncio."""

from __future__ import annotations

import asyncio

from pgstore.postgres.store_async import AsyncStore

__all__ = ["AsyncThing"]


class AsyncThing(AsyncStore):
    """Works an ``AsyncConnection`` for asyncio."""

    async def __aenter__(self) -> AsyncThing:
        async with self._lock:  # an asyncio lock
            await self.start()
        return self

    async def go(self, n: int) -> int:
        if True:  # ASYNC
            return await asyncio.to_thread(abs, n)
        else:
            return abs(n)

    def lock(self) -> asyncio.Lock:
        if True:  # ASYNC: only here
            print("async")
        return asyncio.Lock()
'''

EXPECTED = '''"""A store, for threads."""

from __future__ import annotations

import threading

from pgstore.postgres.store import SyncStore
from pgstore.postgres.thing_async import AsyncThing

__all__ = ["AsyncThing", "Thing"]


class Thing(SyncStore):
    """Works an ``Connection`` for threads."""

    def __enter__(self) -> Thing:
        with self._lock:  # a sync lock
            self.start()
        return self

    def go(self, n: int) -> int:
        return abs(n)

    def lock(self) -> threading.Lock:
        return threading.Lock()
'''


def test_the_generator_rewrites_a_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool = _tool()
    source = tmp_path / "pgstore" / "postgres" / "thing_async.py"
    source.parent.mkdir(parents=True)
    source.write_text(SOURCE, encoding="utf-8")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    monkeypatch.setitem(tool.NAMES, "AsyncThing", "Thing")
    made = tool.generate("pgstore/postgres/thing_async.py")
    header = ("# generated from pgstore/postgres/thing_async.py by tools/async_to_sync.py;\n"
              "# edit pgstore/postgres/thing_async.py and run `make generate`.\n")
    assert made == header + EXPECTED, made


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ('def f(x: int) -> str:\n    return f"{AsyncStore} {x}"\n', "f-string"),
        ("def f(x: int) -> int:\n    if x:  # ASYNC\n        return 1\n    return 0\n",
         "'if True:' only"),
        ("import asyncio as aio\n", "no 'as'"),
    ],
)
def test_the_generator_refuses_what_it_cannot_rewrite(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, refusal: str
) -> None:
    tool = _tool()
    source = tmp_path / "pgstore" / "odd_async.py"
    source.parent.mkdir(parents=True)
    source.write_text("from pgstore.postgres.store_async import AsyncStore\n\n" + body,
                      encoding="utf-8")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    with pytest.raises(ValueError, match=refusal):
        tool.generate("pgstore/odd_async.py")
