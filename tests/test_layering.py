"""The package layout is the architecture (docs/ARCHITECTURE.md §1): keep its layering.

- `pystatestore.store` (format and storage engine) imports neither `worker` nor `tools`;
- `pystatestore.worker` (the process the JVM talks to) imports `store` only;
- `pystatestore.reading` (a checkpoint read without Spark) imports `store`; `pystatestore.queryable`
  (the service that answers beside a running query) imports `reading` and `store`;
  `pystatestore.tools` (the `pystatestore` command) all three; none of them imports `worker`, and
  `worker` none of them;
- nothing below the top imports the public facade (`pystatestore/__init__`); the leaf modules
  (`release`, `spark_minors`) import nothing of the package, so every layer may use them;
- no import circle, inside a layer or across: a module in a circle cannot be read, tested or changed
  apart from the others. A package's `__init__` counts as a module of its own (a phase module that
  takes a name from its package's `__init__` imports it), and importing `a.b.c` is not counted as
  importing `a` and `a.b` (that is how Python packages load, not a design choice).

Read from the source with `ast` (imports inside functions and under TYPE_CHECKING count too), so
the check needs nothing importable and cannot be fooled by what a module happens to import at run
time.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "python" / "pystatestore"
TOP = "pystatestore"
LEAVES = {"release", "spark_minors"}
# What each part may import from the package (besides itself).
ALLOWED = {
    "store": {"leaf"},
    "worker": {"store", "leaf"},
    "reading": {"store", "leaf"},
    "queryable": {"reading", "store", "leaf"},
    "tools": {"queryable", "reading", "store", "leaf"},
    "leaf": set(),
}


def module_name(path: Path, package_dir: Path) -> str:
    rel = path.relative_to(package_dir.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def part_of(module: str) -> str | None:
    """The layer a module of the package belongs to; "facade" for the top package itself."""
    parts = module.split(".")
    if parts[0] != TOP:
        return None
    if len(parts) == 1:
        return "facade"
    if parts[1] in LEAVES:
        return "leaf"
    return parts[1]


def imported_modules(path: Path, package_dir: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of `path`, relative ones resolved; `from X import name`
    counts as importing X.name when that is a module of the package, else X."""
    this = module_name(path, package_dir)
    package = this if path.name == "__init__.py" else this.rsplit(".", 1)[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                as_path = package_dir.parent.joinpath(*candidate.split("."))
                is_module = as_path.with_suffix(".py").is_file() or (as_path / "__init__.py").is_file()
                found.append((node.lineno, candidate if is_module else base))
    return found


def layering_violations(package_dir: Path) -> list[str]:
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        this = module_name(path, package_dir)
        mine = part_of(this)
        if mine == "facade":
            continue  # the public API sits on top of everything
        for line, target in imported_modules(path, package_dir):
            theirs = part_of(target)
            if theirs is None or theirs == mine:
                continue
            if theirs not in ALLOWED.get(mine or "", set()):
                problems.append(f"{path.relative_to(package_dir.parent)}:{line}: {mine} imports {target} ({theirs})")
    return problems


def import_graph(package_dir: Path) -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: the first line that does}."""
    modules = {module_name(p, package_dir): p for p in sorted(package_dir.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for name, path in modules.items():
        for line, target in imported_modules(path, package_dir):
            if target in modules and target != name:
                graph[name].setdefault(target, line)
    return graph


def import_circles(package_dir: Path) -> list[str]:
    """Every strongly connected group of two or more modules (Tarjan), each described by the
    imports that tie it: `a:12 -> b`."""
    graph = import_graph(package_dir)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the package's module count
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    described = []
    for group in sorted(groups):
        ties = [f"{a}:{graph[a][b]} -> {b}" for a in group for b in sorted(graph[a]) if b in group]
        described.append("circle of " + ", ".join(group) + ": " + "; ".join(ties))
    return described


def layout_copy(tmp_path: Path, sources: dict[str, str]) -> Path:
    """The package's layout (which names are modules) with empty files, and `sources` written in."""
    package = tmp_path / TOP
    for path in PACKAGE_DIR.rglob("*.py"):
        target = package / path.relative_to(PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")
    for where, source in sources.items():
        (package / where).parent.mkdir(parents=True, exist_ok=True)
        (package / where).write_text(source)
    return package


def test_every_module_belongs_to_a_part() -> None:
    parts = {part_of(module_name(p, PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py")}
    assert parts <= {"facade", "leaf", "store", "worker", "reading", "queryable", "tools"}, parts


def test_the_layers_import_only_downward() -> None:
    assert layering_violations(PACKAGE_DIR) == []


def test_no_module_imports_itself_back() -> None:
    assert import_circles(PACKAGE_DIR) == []


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("store/remote.py", "from ..worker import service\n", "store imports pystatestore.worker.service (worker)"),
        ("store/backends/base.py", "from ...reading.checkpoint import x\n", "store imports pystatestore.reading"),
        ("reading/checkpoint.py", "from ..queryable import client\n", "reading imports pystatestore.queryable.client"),
        ("queryable/client.py", "from ..tools.report import x\n", "queryable imports pystatestore.tools.report"),
        ("store/manifest.py", "import pystatestore.tools.cli\n", "store imports pystatestore.tools.cli (tools)"),
        ("tools/report.py", "from pystatestore.worker.service import X\n", "tools imports pystatestore.worker"),
        ("worker/service.py", "def f():\n    from ..tools import cli\n", "worker imports pystatestore.tools.cli"),
        ("store/leases.py", "from .. import __version__\n", "store imports pystatestore (facade)"),
        ("release.py", "from pystatestore.store import errors\n", "leaf imports pystatestore.store.errors"),
    ],
)
def test_a_forbidden_import_is_found(tmp_path: Path, where: str, source: str, expected: str) -> None:
    """The check itself, on a copy of the package's layout with one forbidden import added."""
    problems = layering_violations(layout_copy(tmp_path, {where: source}))
    assert len(problems) == 1 and expected in problems[0], problems


@pytest.mark.parametrize(
    ("sources", "members"),
    [
        # Two modules of one layer, each importing the other at the top.
        (
            {"store/manifest.py": "from .changelog import x\n", "store/changelog.py": "from .manifest import y\n"},
            ["pystatestore.store.changelog", "pystatestore.store.manifest"],
        ),
        # One side only for type hints, the other inside a function: both still tie the two.
        (
            {
                "tools/cli.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .report import R\n",
                "tools/report.py": "def f():\n    from . import cli\n",
            },
            ["pystatestore.tools.cli", "pystatestore.tools.report"],
        ),
        # Three modules round a loop, one of them a package's __init__ its own module imports from.
        (
            {
                "store/backends/__init__.py": "from .memory import M\n",
                "store/backends/memory.py": "from .context import C\n",
                "store/backends/context.py": "from . import BACKENDS\n",
            },
            [f"pystatestore.store.backends{m}" for m in ("", ".context", ".memory")],
        ),
    ],
)
def test_an_import_circle_is_found(tmp_path: Path, sources: dict[str, str], members: list[str]) -> None:
    """The check itself, on a copy of the package's layout with one circle written in."""
    circles = import_circles(layout_copy(tmp_path, sources))
    assert len(circles) == 1 and circles[0].startswith("circle of " + ", ".join(members) + ":"), circles


def test_a_one_way_import_is_no_circle(tmp_path: Path) -> None:
    sources = {"store/manifest.py": "from .changelog import x\n", "store/changelog.py": "import zlib\n"}
    assert import_circles(layout_copy(tmp_path, sources)) == []


def test_every_module_imports() -> None:
    """A name moved to another module but still imported from the old one fails here, at once,
    rather than in the worker process of a Spark test."""
    import importlib
    import pkgutil

    import pystatestore

    failed = {}
    for info in pkgutil.walk_packages(pystatestore.__path__, f"{TOP}."):
        if info.name.endswith("__main__"):
            continue  # runs the worker
        try:
            importlib.import_module(info.name)
        except Exception as e:  # noqa: BLE001 - every failure is reported, whatever it is
            failed[info.name] = repr(e)
    assert failed == {}
