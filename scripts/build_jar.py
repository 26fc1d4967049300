"""Compile the Scala shim with the Scala compiler that ships in pyspark's jars/ (no Maven needed).

Used by the wheel build (setup.py) and usable by hand; gradle does the same through a JavaExec task.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "jvm-shim" / "src" / "main" / "scala"
JAR_NAME = "pystatestore-shim.jar"


def spark_jars_dir() -> Path:
    """pyspark's bundled jars: the compile classpath and the Scala compiler itself."""
    override = os.environ.get("PYSTATESTORE_SPARK_JARS")
    if override:
        return Path(override)
    import pyspark  # the build environment must have pyspark 4.1.x

    return Path(pyspark.__file__).resolve().parent / "jars"


def compile_jar(
    out_jar: Path, extra_sources: list[Path] | None = None, classpath_extra: list[str] | None = None
) -> Path:
    jars = sorted(glob.glob(str(spark_jars_dir() / "*.jar")))
    if not any("scala-compiler-2.13" in j for j in jars):
        sys.exit(f"no scala-compiler-2.13 jar in {spark_jars_dir()}: is pyspark 4.1 installed?")
    sources = (
        [str(p) for p in sorted(SOURCES.rglob("*.scala"))] if extra_sources is None else [str(p) for p in extra_sources]
    )
    classes = Path(tempfile.mkdtemp(prefix="pystatestore-classes-"))
    try:
        cp = os.pathsep.join(jars + (classpath_extra or []))
        cmd = [
            "java",
            "-Xss8m",
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
            raise SystemExit(f"scalac failed to compile {len(sources)} source file(s); see the errors above")
        out_jar.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(out_jar, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in sorted(classes.rglob("*")):
                if f.is_file():
                    zf.write(f, f.relative_to(classes).as_posix())
    finally:
        shutil.rmtree(classes, ignore_errors=True)
    return out_jar


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "jvm-shim" / "build" / "libs" / JAR_NAME)
    args = ap.parse_args()
    print(compile_jar(args.out))


if __name__ == "__main__":
    main()
