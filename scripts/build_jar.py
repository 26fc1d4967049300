"""Compile the Scala shim, one jar per Spark minor, with the Scala compiler that ships in each
minor's pyspark jars/ (no Maven needed).

Each minor compiles the shared core (jvm-shim/src/main) plus its adapter directories, as listed in
jvm-shim/src/minors.txt, against that minor's own jars. The jars of a minor come from
PYSTATESTORE_SPARK_JARS_<4_2> (a directory), else from pyspark <release> installed (no deps) under
the machine's cache, ~/.cache/pystatestore/pyspark-<release>: pip's cache means each release is
downloaded at most once per machine, and every clone and CI run reuses the installed copy.

Used by the wheel build (setup.py: all minors, unless PYSTATESTORE_PREBUILT_JARS names jars gradle
built), by the test and bench scripts and build.gradle (`--provision`, `--pyspark-path`), and by
hand; build.gradle compiles the same way, a task per minor, rebuilding only what changed.
"""

from __future__ import annotations

import argparse
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOT = ROOT / "jvm-shim" / "src"


def _spark_minors():  # noqa: ANN202 - the module, loaded by path so the build needs no install
    spec = importlib.util.spec_from_file_location("spark_minors", ROOT / "python" / "pystatestore" / "spark_minors.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SPARK_MINORS = _spark_minors()
MINORS: list[str] = list(SPARK_MINORS.BUILT_AGAINST)


def source_dirs(minor: str) -> list[Path]:
    """The source directories of `minor`, from jvm-shim/src/minors.txt."""
    for line in (SOURCE_ROOT / "minors.txt").read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        if fields and fields[0] == minor:
            return [SOURCE_ROOT / d / "scala" for d in fields[1:]]
    raise SystemExit(f"Spark minor {minor} is not in {SOURCE_ROOT / 'minors.txt'}; supported: {', '.join(MINORS)}")


def cache_dir() -> Path:
    base = os.environ.get("PYSTATESTORE_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "pystatestore"
    )
    return Path(base)


def pyspark_path(minor: str, *, provision: bool = True) -> Path:
    """A directory to put first on PYTHONPATH to run `minor`'s pyspark (holds pyspark/)."""
    release = SPARK_MINORS.BUILT_AGAINST[minor]
    target = cache_dir() / f"pyspark-{release}"
    if (target / "pyspark" / "jars").is_dir() and (target / ".complete").exists():
        return target
    if not provision:
        raise SystemExit(f"pyspark {release} is not provisioned at {target}: run scripts/build_jar.py --provision")
    print(f"build_jar: installing pyspark {release} (no deps) into {target}", file=sys.stderr, flush=True)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
           "--target", str(partial), f"pyspark=={release}"]  # fmt: skip
    if subprocess.run(cmd).returncode != 0:
        raise SystemExit(f"could not install pyspark {release} into {partial} (command: {' '.join(cmd)})")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    (target / ".complete").touch()
    return target


def reexec_under_pyspark(minor: str) -> None:
    """Runs this script again with `minor`'s pyspark first on PYTHONPATH (benchmarks' --pyspark),
    unless the running pyspark already is of that minor."""
    import pyspark

    if SPARK_MINORS.minor_of(pyspark.__version__) == minor:
        return
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pyspark_path(minor)), env.get("PYTHONPATH")) if p)
    env["PYSTATESTORE_REEXEC_MINOR"] = minor  # a second exec for the same minor means the path did not take
    if os.environ.get("PYSTATESTORE_REEXEC_MINOR") == minor:
        raise SystemExit(f"asked for Spark {minor}, but pyspark {pyspark.__version__} is still imported first")
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def spark_jars_dir(minor: str) -> Path:
    """`minor`'s jars: the compile classpath and the Scala compiler itself."""
    override = os.environ.get(f"PYSTATESTORE_SPARK_JARS_{minor.replace('.', '_')}")
    if override:
        return Path(override)
    return pyspark_path(minor) / "pyspark" / "jars"


def minor_of_jars(jars_dir: Path) -> str:
    """The Spark minor of a jars/ directory, from its spark-core jar's name."""
    found = sorted(glob.glob(str(jars_dir / "spark-core_2.13-*.jar")))
    if not found:
        raise SystemExit(f"no spark-core_2.13-*.jar in {jars_dir}: not a Spark jars/ directory")
    return SPARK_MINORS.minor_of(Path(found[0]).name.removeprefix("spark-core_2.13-").removesuffix(".jar"))


def compile_jar(
    out_jar: Path,
    minor: str,
    *,
    jars_dir: Path | None = None,
    extra_sources: list[Path] | None = None,
    classpath_extra: list[str] | None = None,
) -> Path:
    """Compiles `minor`'s shim (or `extra_sources` against it, for tests) into `out_jar`."""
    jars_dir = jars_dir or spark_jars_dir(minor)
    jars = sorted(glob.glob(str(jars_dir / "*.jar")))
    if not any("scala-compiler-2.13" in j for j in jars):
        raise SystemExit(f"no scala-compiler-2.13 jar in {jars_dir}: is it pyspark {minor}'s jars/?")
    if extra_sources is None:
        sources = [str(p) for d in source_dirs(minor) for p in sorted(d.rglob("*.scala"))]
    else:
        sources = [str(p) for p in extra_sources]
    classes = Path(tempfile.mkdtemp(prefix="pystatestore-classes-"))
    try:
        cp = os.pathsep.join(jars + (classpath_extra or []))
        cmd = [
            "java",
            "-Xss8m",
            "-XX:TieredStopAtLevel=1",  # a short-lived JVM: C2 costs scalac more CPU than it saves (build.gradle)
            "-cp",
            os.pathsep.join(j for j in jars if "/scala-" in j),
            "scala.tools.nsc.Main",
            "-nowarn",
            "-release",
            "17",
            "-d",
            str(classes),
            "-classpath",
            cp,
            *sources,
        ]
        if subprocess.run(cmd).returncode != 0:  # scalac has printed its errors
            raise SystemExit(f"scalac failed to compile {len(sources)} source file(s) for Spark {minor}; see above")
        out_jar.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out_jar, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(classes.rglob("*")):
                if f.is_file():
                    zf.write(f, f.relative_to(classes).as_posix())
    finally:
        shutil.rmtree(classes, ignore_errors=True)
    return out_jar


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minor", choices=MINORS, action="append", help="build this minor (default: all)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "jvm-shim" / "build" / "libs")
    ap.add_argument("--provision", action="store_true", help="only install the minors' pyspark into the cache")
    ap.add_argument(
        "--pyspark-path",
        metavar="MINOR",
        choices=MINORS,
        help="print the directory to put on PYTHONPATH for MINOR's pyspark (installing it if needed)",
    )
    args = ap.parse_args()
    if args.pyspark_path:
        print(pyspark_path(args.pyspark_path))
        return
    for minor in args.minor or MINORS:
        if args.provision:
            print(pyspark_path(minor))
        else:
            print(compile_jar(args.out_dir / SPARK_MINORS.jar_name(minor), minor))


if __name__ == "__main__":
    main()
