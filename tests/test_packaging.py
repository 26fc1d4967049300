"""Both build paths produce the shim: gradle's jar and the jar inside the wheel from `pip install .`."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

import pystatestore

ROOT = Path(__file__).resolve().parent.parent
PROVIDER_CLASS = "org/pystatestore/PythonStateStoreProvider.class"


def classes(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as zf:
        return {n for n in zf.namelist() if n.endswith(".class")}


@pytest.mark.skipif(os.environ.get("PYSTATESTORE_TEST_INSTALLED") != "1", reason="runs against the installed wheel")
def test_wheel_carries_the_jar() -> None:
    jar = Path(pystatestore.jar_path())
    assert "site-packages" in jar.parts, f"expected the installed wheel's jar, got {jar}"
    assert PROVIDER_CLASS in classes(jar)


def test_gradle_jar_matches_the_wheel_jar() -> None:
    gradle_jar = ROOT / "jvm-shim" / "build" / "libs" / "pystatestore-shim.jar"
    if not gradle_jar.exists():
        pytest.skip("gradle jar not built (scripts/setup.sh builds it)")
    assert PROVIDER_CLASS in classes(gradle_jar)
    assert classes(gradle_jar) == classes(Path(pystatestore.jar_path()))


def test_configure_spark_sets_provider_and_jar() -> None:
    class Builder:
        def __init__(self) -> None:
            self._options: dict[str, str] = {"spark.jars": "/opt/other.jar"}

        def config(self, key: str, value: str) -> Builder:
            self._options[key] = value
            return self

    b = pystatestore.configure_spark(Builder(), backend="memory")
    assert b._options["spark.sql.streaming.stateStore.providerClass"] == "org.pystatestore.PythonStateStoreProvider"
    assert b._options["spark.jars"].split(",") == ["/opt/other.jar", pystatestore.jar_path()]
    assert b._options["spark.sql.streaming.stateStore.pystatestore.backend"] == "memory"


def test_jar_and_package_agree_on_release_and_protocol() -> None:
    """The worker refuses a jar of another release by protocol; the numbers must move together."""
    import re

    import tomllib

    from pystatestore.service import PROTOCOL_VERSION

    shim = ROOT / "jvm-shim" / "src" / "main" / "scala" / "org" / "pystatestore"
    release = re.search(r'val Version = "([^"]+)"', (shim / "Release.scala").read_text()).group(1)
    protocol = int(re.search(r"val ProtocolVersion = (\d+)", (shim / "StateWorker.scala").read_text()).group(1))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert release == pystatestore.__version__ == project
    assert protocol == PROTOCOL_VERSION
