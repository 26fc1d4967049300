"""Both build paths produce the shim: gradle's jar and the jars inside the wheel from `pip install .`,
one per Spark minor; and the running pyspark picks its own minor's jar, or is refused clearly."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

import pystatestore
from pystatestore.spark_minors import BUILT_AGAINST, DEFAULT_MINOR, SUPPORTED_RANGE, jar_name

ROOT = Path(__file__).resolve().parent.parent
PROVIDER_CLASS = "org/pystatestore/PythonStateStoreProvider.class"


def classes(jar: Path) -> set[str]:
    with zipfile.ZipFile(jar) as zf:
        return {n for n in zf.namelist() if n.endswith(".class")}


def running_minor() -> str:
    import pyspark

    return pystatestore.minor_of(pyspark.__version__)


@pytest.mark.skipif(os.environ.get("PYSTATESTORE_TEST_INSTALLED") != "1", reason="runs against the installed wheel")
def test_wheel_carries_a_jar_per_minor() -> None:
    jar = Path(pystatestore.jar_path())
    assert "site-packages" in jar.parts, f"expected the installed wheel's jar, got {jar}"
    assert jar.name == jar_name(running_minor())
    for minor, release in BUILT_AGAINST.items():
        minor_jar = Path(pystatestore.jar_path(release))
        assert minor_jar.parent == jar.parent and minor_jar.name == jar_name(minor)
        assert PROVIDER_CLASS in classes(minor_jar)


def test_the_license_is_the_one_declared() -> None:
    """pyproject.toml declares Apache-2.0: LICENSE holds that license's text."""
    text = (ROOT / "LICENSE").read_text()
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text


@pytest.mark.skipif(os.environ.get("PYSTATESTORE_TEST_INSTALLED") != "1", reason="runs against the installed wheel")
def test_wheel_ships_the_license() -> None:
    from importlib.metadata import distribution

    shipped = [f for f in distribution("pystatestore").files or [] if f.name == "LICENSE"]
    assert len(shipped) == 1, f"the installed wheel holds no single LICENSE: {shipped}"
    assert shipped[0].read_text() == (ROOT / "LICENSE").read_text()


def test_gradle_jar_matches_the_wheel_jar() -> None:
    """On every minor: scripts/setup.sh builds each minor's jar with gradle too."""
    gradle_jar = ROOT / "jvm-shim" / "build" / "libs" / jar_name(running_minor())
    if not gradle_jar.exists():
        assert os.environ.get("PYSTATESTORE_TEST_INSTALLED") != "1", f"setup built no gradle jar at {gradle_jar}"
        pytest.skip("gradle jar of this minor not built (scripts/setup.sh builds it)")
    assert PROVIDER_CLASS in classes(gradle_jar)
    assert classes(gradle_jar) == classes(Path(pystatestore.jar_path()))


def test_jars_differ_only_by_adapter() -> None:
    """One shared core: every minor's jar has the same core classes; only adapter classes differ."""
    jars = {m: Path(pystatestore.jar_path(r)) for m, r in BUILT_AGAINST.items()}
    if not all(j.exists() for j in jars.values()):
        pytest.skip("not every minor's jar is built")
    core = set.intersection(*(classes(j) for j in jars.values()))
    assert "org/pystatestore/PythonStateStoreProviderCore.class" in core
    assert PROVIDER_CLASS in core  # each minor's own, compiled from its adapter
    assert "org/pystatestore/ReadStoreSince42.class" in classes(jars["4.2"]) - classes(jars["4.1"])
    assert "org/pystatestore/ReadStoreSince43.class" in classes(jars["4.3"]) - classes(jars["4.2"])
    before_43 = "org/pystatestore/ConstructibleOnLaterMinors.class"
    assert before_43 in classes(jars["4.1"]) & classes(jars["4.2"]) and before_43 not in classes(jars["4.3"])


@pytest.mark.parametrize("version", ["4.0.1", "4.4.0", "3.5.6", "5.0.0", "4"])
def test_jar_selection_refuses_an_unsupported_pyspark(version: str) -> None:
    with pytest.raises(pystatestore.UnsupportedSparkVersionError) as e:
        pystatestore.jar_path(version)
    message = str(e.value)
    assert f"pyspark {version}" in message and SUPPORTED_RANGE in message
    assert "4.1.x, 4.2.x, 4.3.x" in message


@pytest.mark.parametrize("version", ["4.1.0", "4.2.1", "4.3.0", "4.3.7"])
def test_jar_selection_picks_the_minor(version: str) -> None:
    minor = ".".join(version.split(".")[:2])
    assert Path(pystatestore.jar_path(version)).name == jar_name(minor)


def test_configure_spark_refuses_an_unsupported_running_pyspark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pystatestore.spark_minors, "running_pyspark_version", lambda: "4.0.2")

    class Builder:
        def config(self, key: str, value: str) -> Builder:
            raise AssertionError("nothing may be configured for an unsupported pyspark")

    with pytest.raises(pystatestore.UnsupportedSparkVersionError, match=r"pyspark 4\.0\.2"):
        pystatestore.configure_spark(Builder())


def test_default_environment_is_the_newest_minor() -> None:
    """Development, the demo and the full suite run what `pip install pyspark` gives a new user."""
    assert DEFAULT_MINOR == max(BUILT_AGAINST, key=lambda m: tuple(map(int, m.split("."))))
    pins = (ROOT / "requirements-dev.txt").read_text()
    assert f"pyspark[sql]=={BUILT_AGAINST[DEFAULT_MINOR]}" in pins


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

    from pystatestore.worker.service import PROTOCOL_VERSION

    shim = ROOT / "jvm-shim" / "src" / "main" / "scala" / "org" / "pystatestore"
    release = re.search(r'val Version = "([^"]+)"', (shim / "Release.scala").read_text()).group(1)
    protocol = int(re.search(r"val ProtocolVersion = (\d+)", (shim / "StateWorker.scala").read_text()).group(1))
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert release == pystatestore.__version__ == project
    assert protocol == PROTOCOL_VERSION


WRONG_JAR_QUERY = """
import sys, tempfile
from pyspark.sql import SparkSession
spark = (SparkSession.builder.master("local[1]").config("spark.jars", sys.argv[1])
         .config("spark.sql.streaming.stateStore.providerClass", sys.argv[2])
         .config("spark.sql.shuffle.partitions", "1").config("spark.ui.enabled", "false").getOrCreate())
query = (spark.readStream.format("rate").load().groupBy("value").count().writeStream.outputMode("update")
         .format("noop").option("checkpointLocation", tempfile.mkdtemp()).start())
try:
    query.processAllAvailable()
finally:
    spark.stop()
"""


def _jar_minors() -> list[object]:
    """Every other minor's jar, but on 4.3 the 4.1 jar only in the long runs: it meets 4.3 through the
    same source as the 4.2 jar (jvm-shim/src/spark-before-4.3)."""
    running = running_minor()
    return [
        pytest.param(m, marks=pytest.mark.slow) if running == "4.3" and m == "4.1" else m for m in sorted(BUILT_AGAINST)
    ]


@pytest.mark.spark
@pytest.mark.parametrize("jar_minor", _jar_minors())
def test_a_jar_of_another_minor_names_the_jar_to_use(jar_minor: str, tmp_path: Path) -> None:
    """A jar put on a Spark of another minor by hand fails with a message naming the right jar,
    in every direction (4.1/4.2 jars on 4.3 used to die with an AbstractMethodError, and 4.3's on
    4.1 with a NoSuchMethodError, before any check of ours ran)."""
    import subprocess
    import sys

    import pyspark

    running = running_minor()
    if jar_minor == running:
        pytest.skip("the running minor's own jar")
    script = tmp_path / "query.py"
    script.write_text(WRONG_JAR_QUERY)
    jar = pystatestore.jar_path(BUILT_AGAINST[jar_minor])
    proc = subprocess.run(
        [sys.executable, str(script), jar, pystatestore.PROVIDER_CLASS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0, "a query on another minor's jar ran"
    expected = (
        f"built for Spark {jar_minor}, but this JVM runs Spark {pyspark.__version__}. "
        f"Put {jar_name(running)} on the classpath instead"
    )
    assert expected in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-4000:]


def test_the_tests_run_on_a_pandas_the_running_pyspark_supports() -> None:
    """Users of each minor run the pandas it supports: pyspark's own check raises below its minimum
    and warns from pandas 3 on (4.3: "does not yet fully support pandas >= 3.0.0")."""
    import warnings

    from pyspark.sql.pandas.utils import require_minimum_pandas_version

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        require_minimum_pandas_version()
