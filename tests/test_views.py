"""Read views of the rocksdb backend (issue 8), without Spark: what the worker leaves for the JVM,
how keys are counted, which manifests a store accepts, and how local copies share files."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
import rocksdict

from backend_support import changes, commit, make_backend, read_view, state_of
from pystatestore.store.backends import StateBackend
from pystatestore.store.backends.rocksdb.local_db import LocalDB
from pystatestore.store.errors import CheckpointDamagedError, StoreConfigError
from pystatestore.store.manifest import FORMAT_VERSION, KEY_ENCODING_PREFIX


def prefixed(backend: StateBackend) -> StateBackend:
    """The same store opened as a prefix-scan store (session windows) would open it."""
    import dataclasses

    return type(backend)(dataclasses.replace(backend.ctx, key_encoding=KEY_ENCODING_PREFIX), backend.remote)


def new_view(backend: StateBackend) -> str:
    return str(Path(backend.ctx.views_dir) / f"v-{uuid.uuid4().hex}")


def test_commit_leaves_a_view_of_exactly_the_new_version(tmp_path: Path) -> None:
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    commit(b, 0, changes({b"a": b"1", b"b": b"2"}), "t1")
    view = new_view(b)
    result = b.commit(1, changes({b"c": b"3"}, [b"a"]), "t2", num_keys=2, view_dir=view)
    assert read_view(view) == {b"b": b"2", b"c": b"3"}
    assert result.num_keys == 2
    manifest = json.loads((tmp_path / "store" / "manifests" / "2.json").read_text())
    # a changelog manifest leaves the default key encoding out; readers take it as "raw"
    assert manifest["num_keys"] == 2 and manifest["format"] == FORMAT_VERSION
    assert b.read_manifest(2).key_encoding == "raw"


def test_a_load_leaves_a_view_and_sends_no_pairs(tmp_path: Path) -> None:
    commit(make_backend("rocksdb", tmp_path / "store", tmp_path / "w"), 0, changes({b"k": b"v"}), "t")
    fresh = make_backend("rocksdb", tmp_path / "store", tmp_path / "fresh")
    view = new_view(fresh)
    result = fresh.load(1, view)
    assert result.frame is None and result.num_keys == 1
    assert read_view(view) == {b"k": b"v"}


def test_the_worker_reads_no_keys_to_count_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The JVM sends the count; a get per changed key in the worker is what the design removed."""
    gets: list[bytes] = []

    class CountingDB:
        def __init__(self, db: object) -> None:
            self._db = db

        def get(self, key: bytes, *args: object) -> object:
            gets.append(key)
            return self._db.get(key, *args)  # type: ignore[attr-defined]

        def __getattr__(self, name: str) -> object:
            return getattr(self._db, name)

    original = LocalDB.open

    def counting_open(self: LocalDB, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        self.db = CountingDB(self.db)  # type: ignore[assignment]

    monkeypatch.setattr(LocalDB, "open", counting_open)
    real_checkpoint = rocksdict.Checkpoint
    monkeypatch.setattr(
        rocksdict, "Checkpoint", lambda db: real_checkpoint(db._db if isinstance(db, CountingDB) else db)
    )
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    b.commit(0, changes({f"k{i}".encode(): b"v" for i in range(100)}), "t1", num_keys=100)
    b.commit(1, changes({b"k1": b"w"}, [b"k2"]), "t2", num_keys=99)
    assert gets == []


def test_a_rocksdb_commit_without_the_key_count_is_refused(tmp_path: Path) -> None:
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    with pytest.raises(StoreConfigError, match="key count"):
        b.commit(0, changes({b"a": b"1"}), "t")
    assert not (tmp_path / "store" / "manifests").exists()


@pytest.mark.parametrize("where", ["outside", "existing"])
def test_the_worker_writes_views_only_as_new_directories_in_the_views_dir(tmp_path: Path, where: str) -> None:
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    target = tmp_path / "elsewhere" if where == "outside" else Path(b.ctx.views_dir) / "taken"
    if where == "existing":
        target.mkdir()
        (target / "keep").write_text("mine")
    with pytest.raises(StoreConfigError, match="view directory"):
        b.commit(0, changes({b"a": b"1"}), "t", num_keys=1, view_dir=str(target))
    assert not (tmp_path / "elsewhere").exists()
    if where == "existing":
        assert os.listdir(target) == ["keep"]


def test_a_failed_commit_leaves_no_view(tmp_path: Path) -> None:
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")

    def fail(point: str) -> None:
        if point == "commit:uploaded":
            raise OSError("injected")

    b.fault_hook = fail
    view = new_view(b)
    with pytest.raises(OSError, match="injected"):
        b.commit(0, changes({b"a": b"1"}), "t", num_keys=1, view_dir=view)
    assert not os.path.exists(view)


def test_prefix_scan_keys_are_recorded_and_other_layouts_refused(tmp_path: Path) -> None:
    raw = make_backend("rocksdb", tmp_path / "store", tmp_path / "w")
    commit(raw, 0, changes({b"k": b"v"}), "t")  # written as a raw-key store
    with pytest.raises(StoreConfigError) as e:
        prefixed(make_backend("rocksdb", tmp_path / "store", tmp_path / "p")).load(1)
    message = str(e.value)
    assert "'raw'" in message and "'prefix-v1'" in message and "manifests/1.json" in message, message
    store2 = tmp_path / "store2"
    p = prefixed(make_backend("rocksdb", store2, tmp_path / "w2"))
    commit(p, 0, changes({b"\x00\x00\x00\x01pk": b"v"}), "t")
    assert json.loads((store2 / "manifests" / "1.json").read_text())["key_encoding"] == "prefix-v1"
    assert state_of(prefixed(make_backend("rocksdb", store2, tmp_path / "w3")), 1) == {b"\x00\x00\x00\x01pk": b"v"}


def test_format_1_manifests_read_as_raw_keys_and_newer_formats_are_refused(tmp_path: Path) -> None:
    store = tmp_path / "store"
    commit(make_backend("rocksdb", store, tmp_path / "w"), 0, changes({b"k": b"v"}), "t")
    manifest = store / "manifests" / "1.json"
    doc = json.loads(manifest.read_text())
    doc.pop("key_encoding", None)  # changelog manifests leave the default out already
    doc["format"] = 1  # as 0.1 and 0.2 wrote it
    manifest.write_text(json.dumps(doc))
    assert state_of(make_backend("rocksdb", store, tmp_path / "r1"), 1) == {b"k": b"v"}
    with pytest.raises(StoreConfigError, match="prefix-scan stores"):
        prefixed(make_backend("rocksdb", store, tmp_path / "r2")).load(1)
    doc["format"] = FORMAT_VERSION + 1
    manifest.write_text(json.dumps(doc))
    with pytest.raises(CheckpointDamagedError, match="newer pystatestore") as e:
        make_backend("rocksdb", store, tmp_path / "r3").load(1)
    assert "manifests/1.json" in str(e.value)


def test_local_copies_are_hard_links_of_the_view(tmp_path: Path) -> None:
    b = make_backend("rocksdb", tmp_path / "store", tmp_path / "w", options={"localRecoveryInterval": "1"})
    view = new_view(b)
    result = b.commit(0, changes({f"k{i}".encode(): b"v" * 50 for i in range(2000)}), "t", num_keys=2000, view_dir=view)
    assert result.metrics["localCopySaved"] == 1 and result.metrics["localCopyBytesCopied"] == 0
    copy = next((tmp_path / "w" / "recovery" / "v1").glob("*/1-*"))
    for sst in Path(view).glob("*.sst"):
        assert (copy / sst.name).stat().st_ino == sst.stat().st_ino


def test_a_local_copy_on_another_filesystem_is_copied_and_reported(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    if not os.path.isdir("/dev/shm") or os.stat("/dev/shm").st_dev == os.stat(tmp_path).st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the test's temp dir")
    other_fs = Path(tempfile.mkdtemp(prefix="pss-shm-", dir="/dev/shm"))
    try:
        b = make_backend(
            "rocksdb",
            tmp_path / "store",
            tmp_path / "w",
            options={"localRecoveryDir": str(other_fs), "localRecoveryInterval": "1"},
        )
        with caplog.at_level(logging.WARNING, logger="pystatestore.store.local_recovery"):
            result = b.commit(0, changes({b"k": b"v" * 1000}), "t", num_keys=1, view_dir=new_view(b))
            b.commit(1, changes({b"k2": b"v"}), "t2", num_keys=2, view_dir=new_view(b))
        assert result.metrics["localCopySaved"] == 1 and result.metrics["localCopyBytesCopied"] > 0
        warnings = [r.getMessage() for r in caplog.records if "copied, not hard-linked" in r.getMessage()]
        assert len(warnings) == 1 and str(other_fs) in warnings[0] and "localRecoveryDir" in warnings[0]
    finally:
        shutil.rmtree(other_fs, ignore_errors=True)


def test_the_default_local_recovery_dir_is_beside_the_jvm_work_dirs(tmp_path: Path) -> None:
    from pystatestore.store.local_recovery import default_root

    assert default_root(str(tmp_path)) == tmp_path / f"pystatestore-local-recovery-{os.getuid()}"
    assert default_root("").parent == Path(tempfile.gettempdir())
