#!/usr/bin/env bash
# Sets up a fresh machine for pystatestore: Java 17 and gradle from Debian, a venv with the pinned
# Python packages, the shim jars built by gradle, and pystatestore installed as a wheel built by
# 'pip install .' (which takes those jars). Safe to run again: what has not changed is not rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v gradle >/dev/null 2>&1 || missing+=(gradle)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)  # the report test opens the HTML report headless
# Debian's packages download beside the Python ones (different servers): nothing before gradle
# needs them. Their output goes to a log shown only if they fail.
apt_pid=""
wait_for_apt() {
  if [ -n "$apt_pid" ] && ! wait "$apt_pid"; then
    cat .gradle/apt.log >&2
    echo "setup: apt-get could not install ${missing[*]} (log above)" >&2
    exit 1
  fi
  apt_pid=""
}
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} from Debian, beside the Python packages"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  mkdir -p .gradle
  ( $sudo apt-get update -q && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" ) \
    > .gradle/apt.log 2>&1 &
  apt_pid=$!
  [ -z "$sudo" ] || wait_for_apt  # sudo may ask for a password: not in the background
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pyspark, pyarrow, rocksdict, py4j, click, rich, zlib_ng" # fail early if the install did not take

# The wheel carries a jar per Spark minor, each compiled against that minor's own pyspark jars/:
# install each supported pyspark (no deps) once per machine under ~/.cache/pystatestore; pip's
# cache means nothing is downloaded twice. The tests of the other minors run on these too.
echo "setup: the supported Spark minors' pyspark (cached per machine; ${SECONDS}s since setup began)"
.venv/bin/python scripts/build_jar.py --provision > /dev/null

# One gradle run builds every supported minor's shim jar (jvm-shim/src/minors.txt), each against that
# minor's pyspark jars/ in the cache, and compiles a minor again only when its sources or its Spark
# jars changed (up-to-date checks; about 25 s a minor when they did). tests/test_packaging.py checks
# that gradle's jar and the wheel's hold the same classes. No --offline: the first scalaTest run
# fetches its pinned library from Maven Central into ~/.gradle (decision 0047).
# --no-daemon: a gradle daemon would stay up after setup (about 190 MiB, idle), on a user's machine
# and beside every benchmark; the build runs once per setup, so a warm daemon saves nothing.
wait_for_apt
echo "setup: the shim jars of every Spark minor (gradle; compiles only what changed; ${SECONDS}s)"
mkdir -p .gradle
# A failed build fails setup, and gradle deletes the jar of a minor whose compile failed: the tests
# never run against a jar left over from an earlier build.
if ! gradle --no-daemon -q jar > .gradle/build.log 2>&1; then
  grep -vE "^(openjdk|OpenJDK)" .gradle/build.log >&2
  echo "setup: gradle failed to build the shim jars (log above)" >&2
  exit 1
fi
minors=$(.venv/bin/python -c "import sys; sys.path.insert(0, 'python'); from pystatestore.spark_minors import BUILT_AGAINST; print(' '.join(BUILT_AGAINST))")
for minor in $minors; do
  jar=jvm-shim/build/libs/pystatestore-shim-spark$minor.jar
  [ -f "$jar" ] || { echo "setup: gradle built no $jar (is Spark $minor in jvm-shim/src/minors.txt?)" >&2; exit 1; }
done

echo "setup: pip install . (wheel with a jar per Spark minor inside: the ones gradle just built; ${SECONDS}s)"
# setuptools builds in build/ and never removes what it copied there before: a module moved or
# deleted since the last install would otherwise still ship in the wheel.
rm -rf build
if ! PYSTATESTORE_PREBUILT_JARS="$PWD/jvm-shim/build/libs" .venv/bin/pip install -q --disable-pip-version-check \
    --no-deps --force-reinstall . > .gradle/pip-install.log 2>&1; then
  cat .gradle/pip-install.log >&2
  echo "setup: pip install . failed (log above)" >&2
  exit 1
fi
grep -v "^WARNING: Location" .gradle/pip-install.log || true
.venv/bin/python -c "import pystatestore; print('setup: shim jar', pystatestore.jar_path())"
