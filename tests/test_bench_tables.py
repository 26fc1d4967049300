"""README's benchmark figures are the committed bench/ outputs, not typed: scripts/bench_tables.py
generates them, and its --check fails when a block and its files disagree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def copy_of_the_docs(tmp_path: Path) -> Path:
    """README.md, bench/ and the script, laid out as in the checkout, so the copy can be damaged."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "bench_tables.py", tmp_path / "scripts")
    shutil.copy(ROOT / "README.md", tmp_path)
    shutil.copytree(ROOT / "bench", tmp_path / "bench")
    return tmp_path


def check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / "scripts" / "bench_tables.py"), "--check"], capture_output=True, text=True
    )


def test_readme_figures_are_generated_from_the_committed_bench_files() -> None:
    result = check(ROOT)
    assert result.returncode == 0, result.stderr


def test_a_figure_typed_into_readme_fails_the_check(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    readme = root / "README.md"
    block = re.search(r"<!-- bench_tables: summary -->\n(.*?)<!-- /bench_tables -->", readme.read_text(), re.S)
    assert block is not None
    first_ratio = re.search(r"\d\.\d\dx", block[1])
    assert first_ratio is not None
    typed = block[1].replace(first_ratio[0], "0.01x", 1)
    readme.write_text(readme.read_text().replace(block[1], typed))
    result = check(root)
    assert result.returncode == 1
    assert "README.md differs from its bench/ files" in result.stderr and "0.01x" in result.stderr


def test_a_rerun_bench_file_without_its_readme_fails_the_check(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    output = root / "bench" / "aggregation-100k-1pct-spark4.3.txt"
    text = output.read_text()
    line = re.search(r"^  pss-changelog vs rocksdb +batch (\d\.\d\d)x", text, re.M)
    assert line is not None
    output.write_text(text.replace(line[0], line[0].replace(f"{line[1]}x", "9.99x")))
    result = check(root)
    assert result.returncode == 1 and "9.99x" in result.stderr


def test_a_bench_file_that_is_not_a_bench_output_is_named(tmp_path: Path) -> None:
    root = copy_of_the_docs(tmp_path)
    (root / "bench" / "scale-8m-keys-1g-heap-spark4.2.txt").write_text("nothing here\n")
    result = check(root)
    assert result.returncode == 1 and "scale-8m-keys-1g-heap-spark4.2.txt" in result.stderr
