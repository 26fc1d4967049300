"""The backends' write path on an S3 API (a local moto server): commits, restores, maintenance and
GC, local copies, leases and the fault seam, as they run against a bucket rather than a disk.

Object stores differ from a local disk in what this code relies on: no rename (a manifest is
published with one PUT), no directory times (GC must never take a prefix of unknown age for a dead
attempt's), and listings that see an object only once its upload completed. The referee reads the
bucket with boto3, not through pystatestore's storage layer, and parses manifests as raw JSON.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from backend_support import changes, commit, make_backend, materialize_if_due, state_of
from pystatestore.store.errors import CheckpointDamagedError
from s3_support import local_s3

DATA_PREFIXES = ("shared/", "private/", "changelog/")
# (backend, rocksdb commit mode)
KINDS = [("rocksdb", "changelog"), ("rocksdb", "snapshot"), ("memory", None)]


@pytest.fixture(scope="module")
def s3_server() -> Iterator[dict[str, str]]:
    with local_s3() as options:
        yield options


class Bucket:
    """One test's bucket, read and written with boto3 (the referee)."""

    def __init__(self, options: dict[str, str], name: str) -> None:
        import boto3

        self.name = name
        self.client = boto3.client(
            "s3", endpoint_url=f"http://{options['endpoint_override']}", region_name=options["region"]
        )
        self.client.create_bucket(Bucket=name)
        self.options = options

    def uri(self, prefix: str) -> str:
        # s3a:// as Spark gives it: the backend maps it to pyarrow's s3://
        return f"s3a://{self.name}/{prefix}?{urlencode(self.options)}"

    def objects(self, prefix: str) -> dict[str, int]:
        """key relative to `prefix` -> size, for every object under it."""
        out: dict[str, int] = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.name, Prefix=prefix + "/"):
            for o in page.get("Contents", []):
                out[o["Key"][len(prefix) + 1 :]] = o["Size"]
        return out

    def read(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.name, Key=key)["Body"].read()

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)


@pytest.fixture
def bucket(s3_server: dict[str, str], request: pytest.FixtureRequest) -> Bucket:
    name = "t-" + re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-") + f"-{random.randrange(10**6)}"
    return Bucket(s3_server, name)


def referenced_files(bucket: Bucket, store: str) -> dict[str, int]:
    """Every data file the store's manifests and snapshot manifests name, with its size, parsed
    from the raw JSON in the bucket (the stored format: `shared`/`private` name -> {path, size} or
    inline data; `changes` -> {path, size} or data). A changelog version that has a snapshot
    (`snapshots/<version>-<manifest id>.json`) needs no changes file: it goes with the snapshot."""
    needed: dict[str, int] = {}
    keys = bucket.objects(store)
    for key in keys:
        if not re.fullmatch(r"(manifests/\d+|snapshots/\d+-[0-9a-f]+)\.json", key):
            continue
        doc = json.loads(bucket.read(f"{store}/{key}"))
        refs = [*doc.get("shared", {}).values(), *doc.get("private", {}).values()]
        snapshotted = key.startswith("manifests/") and f"snapshots/{doc['version']}-{doc['manifest_id']}.json" in keys
        if doc.get("changes") and not snapshotted:
            refs.append(doc["changes"])
        for ref in refs:
            if ref.get("path"):
                needed[ref["path"]] = ref["size"]
    return needed


def check_bucket(bucket: Bucket, store: str) -> None:
    """Every file a manifest names is there with its size; after GC past the grace no data file is
    left that no manifest names, no lease and no temporary (publishing is one PUT: no renames)."""
    objects = bucket.objects(store)
    needed = referenced_files(bucket, store)
    missing = {p: size for p, size in needed.items() if objects.get(p) != size}
    assert not missing, f"files the manifests name are missing or of another size: {missing}"
    # keys ending in "/" are the empty markers pyarrow writes for directories, not files
    orphans = sorted(k for k in objects if k.startswith(DATA_PREFIXES) and not k.endswith("/") and k not in needed)
    assert not orphans, f"data files no manifest names: {orphans}"
    assert not [k for k in objects if k.startswith("leases/") and k != "leases/"], "a lease outlived its attempt"
    assert not [k for k in objects if ".tmp-" in k or "/.replaced-" in k], "a publish left a temporary"


def options_for(backend: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    # every segment and small file in a file of its own, so the bucket holds data files to check
    base = {"inlineThresholdBytes": "0"} if backend == "rocksdb" else {}
    return {**base, **(extra or {})}


def run_history(b: Any, versions: int, seed: int = 5) -> dict[int, dict[bytes, bytes]]:
    """Commits `versions` versions of puts and deletes, with maintenance (a snapshot when due,
    then retention and GC) after each, as Spark's maintenance thread would; returns each state."""
    rnd = random.Random(seed)
    states: dict[int, dict[bytes, bytes]] = {0: {}}
    for v in range(1, versions + 1):
        state = dict(states[v - 1])
        puts = {f"k{rnd.randrange(400):04d}".encode(): rnd.randbytes(40) for _ in range(150)}
        deletes = sorted(k for k in state if k not in puts and rnd.random() < 0.1)
        commit(b, v - 1, changes(puts, deletes), f"t{v}")
        for k in deletes:
            state.pop(k, None)
        state.update(puts)
        states[v] = state
        materialize_if_due(b)
        b.maintenance()
    return states


@pytest.mark.parametrize(("backend", "mode"), KINDS)
def test_commits_restores_and_gc_on_an_object_store(bucket: Bucket, tmp_path: Path, backend: str, mode: str) -> None:
    uri = bucket.uri("ckpt/state/0/1")
    b = make_backend(
        backend, tmp_path / "unused", tmp_path / "w", retain=3, mode=mode, min_deltas=2,
        options=options_for(backend), store_uri=uri,
    )  # fmt: skip
    states = run_history(b, 12)
    b.maintenance(now=time.time() + 3600)  # past the grace: orphans and stale leases may go
    b.close()
    check_bucket(bucket, "ckpt/state/0/1")
    manifests = bucket.objects("ckpt/state/0/1")
    kept = sorted(int(m[1]) for k in manifests if (m := re.fullmatch(r"manifests/(\d+)\.json", k)))
    assert kept[-1] == 12 and len(kept) >= 4, kept  # the newest and the 3 before it, at least
    for v in kept:
        cold = make_backend(
            backend, tmp_path / "unused", tmp_path / f"cold-{v}", options={"localRecovery": "false"}, store_uri=uri
        )
        assert state_of(cold, v) == states[v], f"version {v} restored from the bucket differs"
        cold.close()


def test_a_same_host_restore_reads_no_data_from_the_bucket(bucket: Bucket, tmp_path: Path) -> None:
    """Local copies and kept changes serve a restore on this host: with every data object deleted
    from the bucket (manifests kept), the restore still gives the exact state."""
    uri, store = bucket.uri("ckpt/state/0/1"), "ckpt/state/0/1"
    recovery = {"localRecoveryDir": str(tmp_path / "rec"), "localRecoveryInterval": "4"}
    b = make_backend(
        "rocksdb",
        tmp_path / "unused",
        tmp_path / "w1",
        min_deltas=2,
        options=options_for("rocksdb", recovery),
        store_uri=uri,
    )
    states = run_history(b, 10)
    b.close()
    for key in bucket.objects(store):
        if key.startswith(DATA_PREFIXES) and not key.endswith("/"):
            bucket.delete(f"{store}/{key}")
    again = make_backend("rocksdb", tmp_path / "unused", tmp_path / "w2", options=recovery, store_uri=uri)
    result = again.load(10)
    assert (result.metrics["restoreRemoteFiles"], result.bytes_read) == (0, 0), result.metrics
    assert state_of(again, 10) == states[10]


def test_a_commit_slower_than_the_grace_keeps_its_files_on_an_object_store(bucket: Bucket, tmp_path: Path) -> None:
    """GC by another instance runs while a slow commit sits between uploading and publishing, at a
    moment when its uploads are older than the grace: the commit's lease (renewed in the bucket)
    keeps them, and the version it publishes restores."""
    uri, store = bucket.uri("ckpt/state/0/1"), "ckpt/state/0/1"
    grace = 10.0
    slow = make_backend("rocksdb", tmp_path / "unused", tmp_path / "slow", grace=grace, mode="snapshot", store_uri=uri)
    commit(slow, 0, changes({b"a": b"1"}), "t1")
    other = make_backend("rocksdb", tmp_path / "unused", tmp_path / "other", grace=grace, store_uri=uri)

    def stall_then_let_gc_run(point: str) -> None:
        if point != "commit:uploaded":
            return
        uploaded_by = time.time()
        deadline = uploaded_by + 60
        while not any(k.startswith("leases/") for k in bucket.objects(store)):
            assert time.time() < deadline, "the commit's lease was not written within 60 s"
            time.sleep(0.1)
        time.sleep(grace / 4 + 0.5)  # let the lease be renewed once after the uploads
        # Uploads are over the grace old at this `now`; a lease renewed within the last grace/4 is not.
        other.maintenance(now=time.time() + grace - grace / 4 - 0.5)

    slow.fault_hook = stall_then_let_gc_run
    commit(slow, 1, changes({f"k{i}".encode(): b"x" * 50 for i in range(2000)}), "t2")
    reader = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "reader", options={"localRecovery": "false"}, store_uri=uri
    )
    assert len(state_of(reader, 2)) == 2001
    other.maintenance(now=time.time() + 3600)
    check_bucket(bucket, store)


@pytest.mark.parametrize("point", ["upload:file", "upload:chunk", "commit:uploaded"])
@pytest.mark.parametrize("mode", ["changelog", "snapshot"])
def test_a_failed_or_partial_upload_publishes_nothing_and_gc_removes_it(
    bucket: Bucket, tmp_path: Path, point: str, mode: str
) -> None:
    """An upload that fails (or stops part-way through a file, or a commit that dies before its
    manifest) leaves no manifest: readers see the version before, the retry commits, and GC past
    the grace removes what the failed attempt wrote."""
    uri, store = bucket.uri("ckpt/state/0/1"), "ckpt/state/0/1"
    b = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "w", mode=mode, options=options_for("rocksdb"), store_uri=uri
    )
    commit(b, 0, changes({b"a": b"1"}), "t1")
    rnd = random.Random(3)  # incompressible: files span several transfer chunks
    table = changes({f"k{i:05d}".encode(): rnd.randbytes(300) for i in range(8000)})

    def fail(at: str) -> None:
        if at == point:
            raise OSError(f"injected failure at {at}")

    b.fault_hook = fail
    with pytest.raises(OSError, match="injected"):
        commit(b, 1, table, "t2-failed")
    assert "manifests/2.json" not in bucket.objects(store)
    reader = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "r1", options={"localRecovery": "false"}, store_uri=uri
    )
    assert state_of(reader, 1) == {b"a": b"1"}
    b.fault_hook = None
    commit(b, 1, table, "t2")
    b.maintenance(now=time.time() + 3600)
    check_bucket(bucket, store)
    reader = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "r2", options={"localRecovery": "false"}, store_uri=uri
    )
    assert len(state_of(reader, 2)) == table.num_rows + 1


@pytest.mark.parametrize("point", ["download:file", "download:chunk"])
def test_a_failed_or_partial_download_fails_the_restore_and_a_retry_restores(
    bucket: Bucket, tmp_path: Path, point: str
) -> None:
    uri = bucket.uri("ckpt/state/0/1")
    b = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "w", min_deltas=2, options=options_for("rocksdb"), store_uri=uri
    )
    states = run_history(b, 6)
    b.close()
    cold = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "cold", options={"localRecovery": "false"}, store_uri=uri
    )

    def fail(at: str) -> None:
        if at == point:
            raise OSError(f"injected failure at {at}")

    cold.fault_hook = fail
    with pytest.raises(OSError, match="injected"):
        cold.load(6)
    cold.fault_hook = None
    assert state_of(cold, 6) == states[6]


def test_a_damaged_object_is_named(bucket: Bucket, tmp_path: Path) -> None:
    """An object replaced with other bytes of the same size fails the restore naming the file."""
    uri, store = bucket.uri("ckpt/state/0/1"), "ckpt/state/0/1"
    b = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "w", mode="snapshot", options=options_for("rocksdb"), store_uri=uri
    )
    commit(b, 0, changes({f"k{i}".encode(): b"v" * 30 for i in range(500)}), "t1")
    b.close()
    victim = max((k for k in bucket.objects(store) if k.endswith(".sst")), key=len)
    data = bytearray(bucket.read(f"{store}/{victim}"))
    data[len(data) // 2] ^= 0x01
    bucket.client.put_object(Bucket=bucket.name, Key=f"{store}/{victim}", Body=bytes(data))
    cold = make_backend(
        "rocksdb", tmp_path / "unused", tmp_path / "cold", options={"localRecovery": "false"}, store_uri=uri
    )
    with pytest.raises(CheckpointDamagedError) as e:
        cold.load(1)
    assert victim in str(e.value) and "version: 1" in str(e.value), str(e.value)
