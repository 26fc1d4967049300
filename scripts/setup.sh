#!/usr/bin/env bash
# Sets up a fresh machine for pystatestore: Java 17 and gradle from Debian, a venv with the pinned
# Python packages, the shim jar built by gradle (offline), and pystatestore installed as a wheel
# built by 'pip install .' (which compiles the jar into the wheel). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v gradle >/dev/null 2>&1 || missing+=(gradle)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the report test opens the HTML report headless
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} from Debian"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pyspark, pyarrow, rocksdict, py4j, click, rich, zlib_ng" # fail early if the install did not take

# The wheel carries a jar per Spark minor, each compiled against that minor's own pyspark jars/:
# install each supported pyspark (no deps) once per machine under ~/.cache/pystatestore; pip's
# cache means nothing is downloaded twice. The tests of the other minors run on these too.
echo "setup: the supported Spark minors' pyspark (cached per machine)"
.venv/bin/python scripts/build_jar.py --provision > /dev/null

# gradle builds the shim of every supported minor (about 25 s each) against the jars the wheel's are
# compiled against (that minor's pyspark in the cache): tests/test_packaging.py checks, on each
# minor, that both hold the same classes.
mkdir -p .gradle
minors=$(.venv/bin/python -c "import sys; sys.path.insert(0, 'python'); from pystatestore.spark_minors import BUILT_AGAINST; print(' '.join(BUILT_AGAINST))")
for minor in $minors; do
  jar=jvm-shim/build/libs/pystatestore-shim-spark$minor.jar
  echo "setup: building the shim jar for Spark $minor with gradle (offline)"
  # A failed build must fail setup: never run the tests against a jar left over from an earlier build.
  rm -f "$jar"
  jars=$(.venv/bin/python scripts/build_jar.py --pyspark-path "$minor")/pyspark/jars
  # --no-daemon: a gradle daemon would stay up after setup (about 190 MiB, idle), on a user's machine
  # and beside every benchmark; the build runs once per setup, so a warm daemon saves nothing.
  if ! gradle --offline --no-daemon -q jar -PsparkJars="$jars" > .gradle/build.log 2>&1; then
    grep -vE "^(openjdk|OpenJDK)" .gradle/build.log >&2
    echo "setup: gradle failed to build the shim jar for Spark $minor (log above)" >&2
    exit 1
  fi
  test -f "$jar"
done

echo "setup: pip install . (wheel with a jar per Spark minor inside)"
# setuptools builds in build/ and never removes what it copied there before: a module moved or
# deleted since the last install would otherwise still ship in the wheel.
rm -rf build
.venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall . 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pystatestore; print('setup: shim jar', pystatestore.jar_path())"
