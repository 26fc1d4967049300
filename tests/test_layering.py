"""The package layout is the architecture (docs/ARCHITECTURE.md §1): keep its layering.

- `pystatestore.store` (format and storage engine) imports neither `worker` nor `tools`;
- `pystatestore.worker` (the process the JVM talks to) and `pystatestore.tools` (offline tools)
  import `store`, not each other;
- nothing below the top imports the public facade (`pystatestore/__init__`); the leaf modules
  (`release`, `spark_minors`) import nothing of the package, so every layer may use them.

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
    "tools": {"store", "leaf"},
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


def test_every_module_belongs_to_a_part() -> None:
    parts = {part_of(module_name(p, PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py")}
    assert parts <= {"facade", "leaf", "store", "worker", "tools"}, parts


def test_the_layers_import_only_downward() -> None:
    assert layering_violations(PACKAGE_DIR) == []


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("store/remote.py", "from ..worker import service\n", "store imports pystatestore.worker.service (worker)"),
        ("store/backends/base.py", "from ...tools.checkpoint import x\n", "store imports pystatestore.tools"),
        ("store/manifest.py", "import pystatestore.tools.cli\n", "store imports pystatestore.tools.cli (tools)"),
        ("tools/report.py", "from pystatestore.worker.service import X\n", "tools imports pystatestore.worker"),
        ("worker/service.py", "def f():\n    from ..tools import cli\n", "worker imports pystatestore.tools.cli"),
        ("store/leases.py", "from .. import __version__\n", "store imports pystatestore (facade)"),
        ("release.py", "from pystatestore.store import errors\n", "leaf imports pystatestore.store.errors"),
    ],
)
def test_a_forbidden_import_is_found(tmp_path: Path, where: str, source: str, expected: str) -> None:
    """The check itself, on a copy of the package's layout with one forbidden import added."""
    package = tmp_path / TOP
    for path in PACKAGE_DIR.rglob("*.py"):
        target = package / path.relative_to(PACKAGE_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("")  # the layout only: which names are modules
    (package / where).write_text(source)
    problems = layering_violations(package)
    assert len(problems) == 1 and expected in problems[0], problems


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
