"""The `pystatestore serve` command, without Spark: its token and binding rules, the command run
without its `serve` extra, and the limits it is given reaching its requests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pystatestore.queryable.server import ServeConfigError, check_binding
from pystatestore.tools.cli import main
from serve_checkpoint import State, write_checkpoint
from serve_support import free_port, request

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, State]]:
    return write_checkpoint(tmp_path_factory.mktemp("serve"))


def test_an_empty_token_file_and_an_unprotected_ipv6_any_address_are_refused(
    built: tuple[Path, dict[int, State]], tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-checkpoint")  # refused before anything is opened
    for text in ("", " \n"):
        (tmp_path / "token").write_text(text)
        result = CliRunner().invoke(main, ["serve", missing, "--token-file", str(tmp_path / "token")])
        assert result.exit_code == 2 and "is empty" in result.output, result.output
    for host in ("::", "0:0:0:0:0:0:0:0", "0.0.0.0"):
        with pytest.raises(ServeConfigError, match="token"):
            check_binding(host, None)
        result = CliRunner().invoke(main, ["serve", missing, "--host", host], env={"PYSTATESTORE_SERVE_TOKEN": ""})
        assert result.exit_code == 1 and f"serving on {host} would let anyone" in result.output, result.output
    for host in ("::1", "127.0.0.1", "localhost"):
        check_binding(host, None)
    check_binding("::", "s3cret")


BLOCKER = '''
import os
import sys

BLOCKED = set(os.environ["TEST_NOT_INSTALLED"].split(","))


class NotInstalled:
    """Finds the blocked modules nowhere, as if the extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''


def run_pystatestore(args: list[str], tmp_path: Path, not_installed: str = "", **popen: Any) -> Any:
    """The `pystatestore` command (the installed entry point when the suite tests the wheel, else
    what that entry point runs, from this checkout) in a process of its own; `not_installed`: the
    modules it must find nowhere."""
    path = [str(tmp_path / "site")]
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    script = Path(sys.executable).parent / "pystatestore"
    if os.environ.get("PYSTATESTORE_TEST_INSTALLED") == "1" and script.exists():
        command = [str(script)]
    else:
        command = [sys.executable, "-c", "import sys; from pystatestore.tools.cli import main; sys.exit(main())"]
        path.append(str(ROOT / "python"))
    env = {k: v for k, v in os.environ.items() if k != "PYSTATESTORE_SERVE_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["TEST_NOT_INSTALLED"] = not_installed
    if popen:
        return subprocess.Popen([*command, *args], env=env, **popen)
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("not_installed", "named"),
    [
        ("starlette,uvicorn,prometheus_client", "starlette, uvicorn, prometheus_client, which are"),
        ("prometheus_client", "prometheus_client, which is"),
        ("", None),  # the control: with the extra, the same command gets as far as the checkpoint
    ],
)
def test_serve_without_its_extra_says_what_to_install_before_opening_anything(
    tmp_path: Path, not_installed: str, named: str | None
) -> None:
    missing = tmp_path / "no-such-checkpoint"
    done = run_pystatestore(["serve", str(missing)], tmp_path, not_installed)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    if named is None:
        assert "there is no checkpoint directory here" in done.stderr, done.stderr
        return
    assert done.stderr.strip().splitlines() == [
        f"Error: the service needs {named} not installed: pip install 'pystatestore[serve]'"
    ], done.stderr
    assert not missing.exists()


def test_the_serve_command_pages_scans_and_caps_lookups_with_the_limits_it_was_given(
    built: tuple[Path, dict[int, State]], tmp_path: Path
) -> None:
    port = free_port()
    args = ["serve", str(built[0]), "--port", str(port), "--restore-in", "thread", "--scratch", str(tmp_path)]
    args += ["--scan-limit-default", "3", "--scan-limit-max", "7", "--lookup-keys-max", "4", "--poll-seconds", "5"]
    with open(tmp_path / "log", "wb") as log:
        process = run_pystatestore(args, tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            assert process.poll() is None, (tmp_path / "log").read_text()
            try:
                if request(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the service did not start"
            time.sleep(0.1)
        status, page = request(port, "GET", "/v1/scan")
        assert status == 200 and len(page["rows"]) == 3 and page["cursor"], page
        status, body = request(port, "GET", "/v1/scan?limit=8")
        assert status == 400 and "(7)" in body["error"], body
        assert request(port, "GET", "/v1/scan?limit=7")[0] == 200
        keys = [{"user": "u1", "n": n} for n in range(5)]
        assert request(port, "POST", "/v1/lookup", {"keys": keys[:4]})[0] == 200
        status, body = request(port, "POST", "/v1/lookup", {"keys": keys})
        assert status == 400 and "(4)" in body["error"], body
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
