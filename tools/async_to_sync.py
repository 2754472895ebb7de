"""Make the sync modules of pgstore from their asyncio sources: ``make generate``.

Each asyncio module ``X_async.py`` in ``SOURCES`` is the hand-written one; this script
writes the sync module ``X.py`` beside it, which nobody edits. The rewrite is guided by
the syntax tree (``ast``) but done on the source text, so the sync module keeps the
source's layout, comments and docstrings:

* ``async def``, ``async with``, ``async for`` lose ``async``; ``await x`` becomes ``x``;
* each name of ``NAMES`` (a class, function, attribute, imported name or module,
  ``asyncio`` included) becomes its sync twin, and a module of ``SOURCES`` becomes its
  sync module;
* in strings and comments (docstrings, string annotations, ``__all__``) the same names
  are renamed as words, after the phrases of ``PHRASES``;
* ``if True:  # ASYNC`` keeps its body in the asyncio module only: the sync module gets
  the ``else:`` body instead (dedented), or nothing when there is no ``else``. This is
  the one way to write code that differs between the two, kept for what cannot be
  renamed (a sync function run off the event loop, ``asyncio.to_thread``);
* the names the source defines and lists in its ``__all__`` are imported and listed
  in the sync module too, so ``X`` offers both flavours, as a hand-written pair did;
* imports left unused are dropped, imports and ``__all__`` sorted (``ruff check --fix``
  with only F401, I001 and RUF022), and a header names the source.

``--out-dir DIR`` writes the sync modules under ``DIR`` (same relative paths) instead
of beside their sources: ``tests/test_generated_sync.py`` compares them with the
committed ones.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import subprocess
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The hand-written asyncio modules, each the source of the sync module beside it
#: (``X_async.py`` gives ``X.py``), relative to the repository root.
SOURCES = (
    "pgstore/protocols/stores_async.py",
    "pgstore/postgres/runner_async.py",
    "pgstore/postgres/store_async.py",
    "pgstore/postgres/schedules_async.py",
    "pgstore/postgres/jobs_async.py",
)

#: The asyncio names and their sync twins, in code, strings and comments.
NAMES = {
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncCursor": "Cursor",
    "AsyncJobStore": "JobStore",
    "AsyncPgJobStore": "PgJobStore",
    "AsyncPgScheduleStore": "PgScheduleStore",
    "AsyncRunner": "SyncRunner",
    "AsyncScheduleStore": "ScheduleStore",
    "AsyncSource": "SyncSource",
    "AsyncStore": "SyncStore",
    "_Async": "_Sync",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "_dead_async": "_dead",
    "_reconnect_again_async": "_reconnect_again",
    "owned_pool_async": "owned_pool",
    "probe_async": "probe",
    "verdict_for_async": "verdict_for",
}

#: Modules renamed in code only (``asyncio.Lock`` is ``threading.Lock``); in prose
#: ``PHRASES`` says what ``asyncio`` becomes.
CODE_ONLY_NAMES = {"asyncio": "threading"}

#: Phrases of docstrings and comments, replaced (in this order) before ``NAMES``.
PHRASES = (
    ("an asyncio ", "a sync "),
    ("for asyncio", "for threads"),
    ("asyncio", "sync"),
    ("async with", "with"),
)

HEADER = (
    "# generated from {source} by tools/async_to_sync.py;\n"
    "# edit {source} and run `make generate`.\n"
)

_ASYNC_MARK = re.compile(r"#\s*ASYNC\b")


def sync_module_path(source: str) -> str:
    """``pkg/x_async.py`` -> ``pkg/x.py``."""
    if not source.endswith("_async.py"):
        raise ValueError(f"{source}: an asyncio source is named X_async.py")
    return source[: -len("_async.py")] + ".py"


def _module_name(path: str) -> str:
    return path[: -len(".py")].replace("/", ".")


MODULES = {_module_name(s): _module_name(sync_module_path(s)) for s in SOURCES}


def _words() -> re.Pattern[str]:
    """Any name of ``NAMES``, as a word."""
    names = sorted(map(re.escape, NAMES), key=len, reverse=True)
    return re.compile(r"(?<!\w)(" + "|".join(names) + r")(?!\w)")  # re caches it


def code_name(name: str) -> str | None:
    """The sync twin of a name in code, or None: it stays."""
    return NAMES.get(name) or CODE_ONLY_NAMES.get(name)


def prose(text: str) -> str:
    """A docstring, string or comment of the asyncio module, as the sync one says it."""
    for phrase, sync in PHRASES:
        text = text.replace(phrase, sync)
    return _words().sub(lambda m: NAMES[m.group(1)], text)


class _Edits:
    """Byte-range replacements on the source, applied from the end."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.starts = [0]
        for line in data.splitlines(keepends=True):
            self.starts.append(self.starts[-1] + len(line))
        self.edits: list[tuple[int, int, bytes]] = []

    def offset(self, line: int, col: int) -> int:
        """The byte offset of ``ast``'s (line, byte column)."""
        return self.starts[line - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        start = self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end = self.offset(node.end_lineno, node.end_col_offset)  # type: ignore[attr-defined]
        return start, end

    def replace(self, start: int, end: int, text: bytes) -> None:
        self.edits.append((start, end, text))

    def drop_keyword(self, start: int, keyword: bytes) -> None:
        """Remove ``keyword`` at ``start`` and the blanks after it."""
        if not self.data.startswith(keyword, start):
            raise ValueError(f"expected {keyword!r} at byte {start}")
        end = start + len(keyword)
        while self.data[end : end + 1] in (b" ", b"\t"):
            end += 1
        self.replace(start, end, b"")

    def rename_after(self, start: int, end: int, prefix: bytes, name: str, new: str) -> None:
        """Rename ``name`` where ``prefix name`` first occurs in [start, end)."""
        at = self.data.find(prefix + name.encode(), start, end)
        if at < 0:
            raise ValueError(f"{prefix!r}{name} not found at byte {start}")
        at += len(prefix)
        self.replace(at, at + len(name), new.encode())

    def apply(self) -> bytes:
        out = self.data
        last = len(out) + 1
        for start, end, text in sorted(self.edits, reverse=True):
            if end > last:
                raise ValueError(f"overlapping edits at byte {start}")
            out = out[:start] + text + out[end:]
            last = start
        return out


class _Rewriter(ast.NodeVisitor):
    """Collects the edits that turn the asyncio module into the sync one."""

    def __init__(self, edits: _Edits) -> None:
        self.e = edits
        self.removed: list[tuple[int, int]] = []  # byte ranges of ASYNC-only code

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        start, end = self.e.span(node)
        self.e.drop_keyword(start, b"async")
        self._def(node, start, end)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._def(node, *self.e.span(node))

    def _def(self, node: ast.FunctionDef | ast.AsyncFunctionDef, start: int, end: int) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        if node.name in NAMES:
            self.e.rename_after(start, end, b"def ", node.name, NAMES[node.name])
        self.visit(node.args)
        if node.returns is not None:
            self.visit(node.returns)
        for statement in node.body:
            self.visit(statement)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        start, end = self.e.span(node)
        for decorator in node.decorator_list:
            self.visit(decorator)
        if node.name in NAMES:
            self.e.rename_after(start, end, b"class ", node.name, NAMES[node.name])
        for child in [*node.bases, *node.keywords, *node.body]:
            self.visit(child)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        self.e.drop_keyword(self.e.span(node)[0], b"async")
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self.e.drop_keyword(self.e.span(node)[0], b"async")
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self.e.drop_keyword(self.e.span(node)[0], b"await")
        self.visit(node.value)

    def visit_Name(self, node: ast.Name) -> None:
        new = code_name(node.id)
        if new is not None:
            start, end = self.e.span(node)
            self.e.replace(start, end, new.encode())

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.visit(node.value)
        new = code_name(node.attr)
        if new is not None:
            end = self.e.span(node)[1]
            self.e.replace(end - len(node.attr), end, new.encode())

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._alias(alias)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module in MODULES:
            start, end = self.e.span(node)
            self.e.rename_after(start, end, b"from ", node.module, MODULES[node.module])
        for alias in node.names:
            self._alias(alias)

    def _alias(self, alias: ast.alias) -> None:
        new = code_name(alias.name) or MODULES.get(alias.name)
        if new is not None:
            if alias.asname is not None:
                raise ValueError(f"line {alias.lineno}: {alias.name} is renamed: no 'as'")
            start = self.e.span(alias)[0]
            self.e.replace(start, start + len(alias.name), new.encode())

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str):
            start, end = self.e.span(node)
            text = self.e.data[start:end].decode()
            if prose(text) != text:
                self.e.replace(start, end, prose(text).encode())

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        # Left as it is (before Python 3.12 the parts of an f-string have no positions
        # of their own): an f-string with anything to rename is refused.
        start, end = self.e.span(node)
        text = self.e.data[start:end].decode()
        if prose(text) != text or any(code_name(n.id) for n in ast.walk(node)
                                      if isinstance(n, ast.Name)):
            raise ValueError(f"line {node.lineno}: an f-string with an asyncio name")

    def visit_If(self, node: ast.If) -> None:
        if not self._async_only(node):
            self.generic_visit(node)
            return
        e = self.e
        first = e.starts[node.lineno - 1]
        if not node.orelse:  # the whole statement, its lines included
            self._remove(first, e.starts[node.end_lineno])  # type: ignore[index]
            return
        body_end = node.body[-1].end_lineno
        else_line = node.orelse[0].lineno - 1  # the line of ``else:``
        if e.data[e.starts[else_line - 1] : e.starts[else_line]].strip() != b"else:":
            raise ValueError(f"line {node.lineno}: '# ASYNC' takes an 'else:' of its own line")
        assert body_end is not None and body_end < else_line
        self._remove(first, e.starts[else_line])
        for line in range(else_line + 1, node.end_lineno + 1):  # type: ignore[operator]
            start = e.starts[line - 1]
            if e.data[start : e.starts[line]].strip():
                if e.data[start : start + 4] != b"    ":
                    raise ValueError(f"line {line}: the 'else:' body is indented by 4 spaces")
                e.replace(start, start + 4, b"")  # the sync body is sync already: no renames

    def _async_only(self, node: ast.If) -> bool:
        line = self.e.data[self.e.starts[node.lineno - 1] : self.e.starts[node.lineno]].decode()
        if not _ASYNC_MARK.search(line):
            return False
        if not (isinstance(node.test, ast.Constant) and node.test.value is True):
            raise ValueError(f"line {node.lineno}: '# ASYNC' marks an 'if True:' only")
        return True

    def _remove(self, start: int, end: int) -> None:
        self.e.replace(start, end, b"")
        self.removed.append((start, end))


def _comments(edits: _Edits, source: str, removed: list[tuple[int, int]]) -> None:
    """Comments said the sync way (those in ASYNC-only code go with it)."""
    lines = source.splitlines(keepends=True)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT or prose(tok.string) == tok.string:
            continue
        row, col = tok.start
        start = edits.starts[row - 1] + len(lines[row - 1][:col].encode())
        if any(a <= start < b for a, b in removed):
            continue
        edits.replace(start, start + len(tok.string.encode()), prose(tok.string).encode())


def _exports(tree: ast.Module) -> tuple[list[str], ast.Assign | None]:
    """The names the module defines and lists in ``__all__``, and that ``__all__``."""
    defined: set[str] = set()
    listed: list[str] = []
    node_all = None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            defined.update(names)
            if "__all__" in names:
                node_all = node
                listed = [ast.literal_eval(e) for e in node.value.elts]  # type: ignore[attr-defined]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    return sorted(n for n in listed if n in defined), node_all


def _reexport(text: str, source_module: str, names: list[str]) -> str:
    """Import ``names`` from the source and list them in ``__all__`` as well."""
    if not names:
        return text
    tree = ast.parse(text)
    _, node_all = _exports(tree)
    if node_all is None:
        raise ValueError("a source that exports names has an __all__")
    listed = [ast.literal_eval(e) for e in node_all.value.elts]  # type: ignore[attr-defined]
    edits = _Edits(text.encode())
    every = sorted(set(listed) | set(names))
    one_line = "__all__ = [" + ", ".join(f'"{n}"' for n in every) + "]"
    if len(one_line) > 100:
        one_line = "__all__ = [\n" + "".join(f'    "{n}",\n' for n in every) + "]"
    edits.replace(*edits.span(node_all), one_line.encode())
    last_import = max(n.end_lineno or 0 for n in tree.body
                      if isinstance(n, (ast.Import, ast.ImportFrom)))
    at = edits.starts[last_import]
    edits.replace(at, at, f"from {source_module} import {', '.join(names)}\n".encode())
    return edits.apply().decode()


def _tidy(text: str, target: str) -> str:
    """Unused imports dropped, imports and ``__all__`` sorted: ``ruff check --fix``."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--quiet", "--fix", "--exit-zero",
         "--select", "F401,I001,RUF022", "--stdin-filename", target, "-"],
        input=text, capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parent.parent,  # the repository's ruff settings
    )
    return done.stdout


def generate(source: str) -> str:
    """The text of the sync module made from ``source`` (a path under ``ROOT``)."""
    text = (ROOT / source).read_text(encoding="utf-8")
    tree = ast.parse(text)
    edits = _Edits(text.encode())
    rewriter = _Rewriter(edits)
    rewriter.visit(tree)
    _comments(edits, text, rewriter.removed)
    out = edits.apply().decode()
    out = _reexport(out, _module_name(source), _exports(tree)[0])
    target = sync_module_path(source)
    return HEADER.format(source=source) + _tidy(out, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=ROOT,
                        help="write under this directory instead of the repository")
    args = parser.parse_args(argv)
    for source in SOURCES:
        target = args.out_dir / sync_module_path(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(generate(source), encoding="utf-8")
        print(f"{source} -> {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
