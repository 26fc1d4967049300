"""Builds the shim jars into the wheel, one per Spark minor (see scripts/build_jar.py); metadata
lives in pyproject.toml.

With PYSTATESTORE_PREBUILT_JARS=DIR (scripts/setup.sh sets it to jvm-shim/build/libs once gradle
has built every minor's jar in the same run) the wheel takes the jars from DIR instead of compiling
them again; without it (a plain `pip install .`, an sdist) each minor is compiled here."""

import importlib.util
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithJars(build_py):
    def run(self) -> None:
        super().run()
        spec = importlib.util.spec_from_file_location("build_jar", ROOT / "scripts" / "build_jar.py")
        build_jar = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_jar)
        jars = Path(self.build_lib) / "pystatestore" / "jars"
        prebuilt = os.environ.get("PYSTATESTORE_PREBUILT_JARS")
        for minor in build_jar.MINORS:
            name = build_jar.SPARK_MINORS.jar_name(minor)
            if not prebuilt:
                build_jar.compile_jar(jars / name, minor)
                continue
            source = Path(prebuilt) / name
            if not source.is_file():
                raise SystemExit(
                    f"PYSTATESTORE_PREBUILT_JARS={prebuilt} has no {name}: build the jars first "
                    "(gradle --no-daemon jar), or unset it to compile them here"
                )
            jars.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, jars / name)


setup(cmdclass={"build_py": BuildPyWithJars})
