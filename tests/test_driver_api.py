"""pgstore uses psycopg and psycopg_pool through their public API only.

No pgstore module (the library, the bench, the demo) imports a psycopg_pool name
other than the package's own (``psycopg_pool.pool``, ``psycopg_pool.pool_async``,
``psycopg_pool.base``... are its internals), a psycopg module outside the documented
ones, or any ``_``-prefixed name of either, by import or by attribute: a release of
either may change those at will, and the pins in pyproject.toml have no upper bound.
Nor does any module read a function's code object (``__code__``, ``co_filename``...):
what the standard library's generated code looks like (a dataclass's ``__init__``
compiled from ``"<string>"``) is no more public.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import psycopg_pool
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pgstore"

#: psycopg's documented modules (https://www.psycopg.org/psycopg3/docs/api/).
PSYCOPG_MODULES = frozenset(
    {"abc", "adapt", "conninfo", "crdb", "errors", "pq", "rows", "sql", "types"}
)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_violations(module: str) -> Iterator[str]:
    """What is not public in the dotted path of a psycopg or psycopg_pool module."""
    parts = module.split(".")
    if parts[0] not in ("psycopg", "psycopg_pool"):
        return
    if any(_private(part) for part in parts):
        yield f"private module {module}"
    elif parts[0] == "psycopg_pool" and len(parts) > 1:
        yield f"psycopg_pool's internal module {module}"
    elif parts[0] == "psycopg" and len(parts) > 1 and parts[1] not in PSYCOPG_MODULES:
        yield f"undocumented psycopg module {module}"


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """``a.b.c`` as ["a", "b", "c"]; None when it does not start at a plain name."""
    names: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        names.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    names.append(current.id)
    return names[::-1]


def violations(source: str) -> list[str]:
    """The non-public psycopg / psycopg_pool names ``source`` imports or reaches."""
    found: list[str] = []
    tree = ast.parse(source)
    aliases: dict[str, str] = {}  # local name -> the psycopg module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.extend(_module_violations(alias.name))
                if alias.name.split(".")[0] in ("psycopg", "psycopg_pool"):
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.extend(_module_violations(node.module))
            if node.module.split(".")[0] not in ("psycopg", "psycopg_pool"):
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"private name {node.module}.{alias.name}")
                elif node.module == "psycopg_pool" and alias.name not in psycopg_pool.__all__:
                    found.append(f"psycopg_pool.{alias.name}, not in psycopg_pool.__all__")
                elif node.module == "psycopg":
                    # ``from psycopg import rows``: a submodule, checked as one
                    found.extend(
                        v for v in _module_violations(f"psycopg.{alias.name}")
                        if alias.name.islower() and not alias.name.startswith("connect")
                    )
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:  # whole chains only
            chain = _attribute_chain(node)
            if chain is None or chain[0] not in aliases:
                continue
            dotted = [*aliases[chain[0]].split("."), *chain[1:]]
            if any(_private(part) for part in dotted):
                found.append(f"private name {'.'.join(dotted)}")
            elif dotted[0] == "psycopg_pool" and len(dotted) > 1 \
                    and dotted[1] not in psycopg_pool.__all__:
                found.append(f"{'.'.join(dotted)}, not in psycopg_pool.__all__")
    return sorted(set(found))


def code_reads(source: str) -> list[str]:
    """The attributes of code objects (and the ``__code__`` that reaches them) read."""
    return sorted({
        node.attr for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and (node.attr == "__code__" or node.attr.startswith("co_"))
    } | {
        node.value for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and node.value in ("__code__", "co_filename")
    })


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from psycopg_pool.pool import AddConnection",
         ["psycopg_pool's internal module psycopg_pool.pool"]),
        ("from psycopg_pool.pool_async import MaintenanceTask as M",
         ["psycopg_pool's internal module psycopg_pool.pool_async"]),
        ("import psycopg_pool.base", ["psycopg_pool's internal module psycopg_pool.base"]),
        ("import psycopg_pool\npsycopg_pool.pool.AddConnection",
         ["psycopg_pool.pool.AddConnection, not in psycopg_pool.__all__"]),
        ("from psycopg_pool import _acompat", ["private name psycopg_pool._acompat"]),
        ("from psycopg import _tpc", ["private name psycopg._tpc"]),
        ("from psycopg._encodings import pg2pyenc", ["private module psycopg._encodings"]),
        ("import psycopg\npsycopg._cmodule", ["private name psycopg._cmodule"]),
        ("import psycopg as pg\npg.errors._sqlstate", ["private name psycopg.errors._sqlstate"]),
        ("from psycopg_pool import ConnectionPool, PoolTimeout", []),
        ("from psycopg.rows import tuple_row\nfrom psycopg.pq import TransactionStatus", []),
        ("import psycopg\npsycopg.errors.UndefinedFunction\npsycopg.__version__", []),
        ("from psycopg.conninfo import make_conninfo", []),
    ],
)
def test_the_scan_tells_public_from_internal(source: str, expected: list[str]) -> None:
    assert violations(source) == expected


def test_no_pgstore_module_uses_a_non_public_driver_name() -> None:
    """Every module of the package, the bench and the demo included."""
    modules = _modules()
    assert len(modules) > 40, modules
    found = {
        str(path.relative_to(PACKAGE.parent)): v
        for path in modules
        if (v := violations(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_no_pgstore_module_reads_code_objects() -> None:
    """Which class builds a row by its slots is said by ``rows.SLOT_BUILT`` (and checked
    by tests/test_runner.py), not guessed from where its ``__init__`` was compiled."""
    assert code_reads('getattr(cls.__init__, "__code__").co_filename') == [
        "__code__", "co_filename"]
    found = {
        str(path.relative_to(PACKAGE.parent)): v
        for path in _modules()
        if (v := code_reads(path.read_text(encoding="utf-8")))
    }
    assert found == {}
