"""A full or unwritable disk is told as such, by which of the store's places it is in (the worker's
replies; tests/test_first_error.py runs the same through real queries)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from backend_support import make_backend
from pystatestore.store.backends.context import StoreContext
from pystatestore.store.errors import LocalDiskError
from pystatestore.worker.disk_errors import disk_failure
from pystatestore.worker.replies import reply


def context(tmp_path: Path) -> StoreContext:
    """A store as its worker opens it: the checkpoint under ckpt/, this host's places under local/
    (local recovery in local/recovery)."""
    return make_backend("memory", tmp_path / "ckpt" / "state" / "0" / "3", tmp_path / "local").ctx


def failing(e: BaseException, tmp_path: Path) -> str:
    def run() -> dict:
        raise e

    return json.loads(reply(run, store=lambda: context(tmp_path), doing="commit of version 7"))["error"]["message"]


def test_an_unwritable_checkpoint_file_is_named_with_what_to_do(tmp_path: Path) -> None:
    file = tmp_path / "ckpt" / "state" / "0" / "3" / "manifests" / ".tmp-7.json-ab"
    text = failing(PermissionError(errno.EACCES, "Permission denied", str(file)), tmp_path)
    assert "commit of version 7 of store file:" in text
    assert f"the checkpoint location cannot be written (Permission denied at {file})" in text
    assert f"make {tmp_path / 'ckpt' / 'state' / '0' / '3'} writable" in text


def test_rocksdbs_full_disk_in_the_local_directory_is_named(tmp_path: Path) -> None:
    sst = tmp_path / "local" / "db-3" / "000009.sst"
    e = Exception(f"IO error: No space left on device: While appending to file: {sst}: No space left on device")
    text = failing(e, tmp_path)
    assert f"this host's local work directory is full (No space left on device at {sst}" in text
    assert "set spark.local.dir to a directory on a larger disk" in text


def test_a_full_local_recovery_directory_names_its_conf(tmp_path: Path) -> None:
    copy = tmp_path / "local" / "recovery" / "v1" / "x" / "000009.sst"
    text = failing(OSError(errno.ENOSPC, "No space left on device", str(copy)), tmp_path)
    assert "this host's local recovery directory is full" in text
    assert "spark.sql.streaming.stateStore.pystatestore.localRecoveryDir" in text


@pytest.mark.parametrize("with_cause", [True, False])
def test_our_own_errors_text_is_not_taken_for_the_failing_file(tmp_path: Path, with_cause: bool) -> None:
    """A store error names the store's directory (in the checkpoint); the full disk it tells of
    is elsewhere, so no path is read from its text."""
    error = LocalDiskError(
        "the local database could not be opened (No space left on device)",
        store=f"file:{tmp_path}/ckpt/state/0/3",
        version=0,
    )
    if with_cause:
        error.__cause__ = Exception("IO error: No space left on device (os error 28)")
    failure = disk_failure(error)
    assert failure is not None and failure.kind == "full" and failure.path == ""


@pytest.mark.parametrize("other", [ValueError("bad key"), OSError(errno.EIO, "Input/output error")])
def test_other_failures_are_not_called_disk_failures(other: BaseException, tmp_path: Path) -> None:
    assert disk_failure(other) is None
    assert "The cause:" not in failing(other, tmp_path)
