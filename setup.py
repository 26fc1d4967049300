"""Builds the shim jars into the wheel, one per Spark minor (see scripts/build_jar.py); metadata
lives in pyproject.toml."""

import importlib.util
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
        for minor in build_jar.MINORS:
            build_jar.compile_jar(jars / build_jar.SPARK_MINORS.jar_name(minor), minor)


setup(cmdclass={"build_py": BuildPyWithJars})
