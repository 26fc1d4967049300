#!/usr/bin/env bash
# Sets up a fresh machine for pystatestore: Java 17 and gradle from Debian, a venv with the pinned
# Python packages, the shim jar built by gradle (offline), and pystatestore installed as a wheel
# built by 'pip install .' (which compiles the jar into the wheel). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v gradle >/dev/null 2>&1 || missing+=(gradle)
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]} from Debian"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pyspark, pyarrow, rocksdict, py4j" # fail early if the install did not take

echo "setup: building the shim jar with gradle (offline)"
# A failed build must fail setup: never run the tests against a jar left over from an earlier build.
rm -f jvm-shim/build/libs/pystatestore-shim.jar
mkdir -p .gradle
if ! gradle --offline -q jar > .gradle/build.log 2>&1; then
  grep -vE "^(openjdk|OpenJDK)" .gradle/build.log >&2
  echo "setup: gradle failed to build the shim jar (log above)" >&2
  exit 1
fi
test -f jvm-shim/build/libs/pystatestore-shim.jar

echo "setup: pip install . (wheel with the jar inside)"
.venv/bin/pip install -q --disable-pip-version-check --no-deps --force-reinstall . 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import pystatestore; print('setup: shim jar', pystatestore.jar_path())"
