"""Spark's checkpoint format v2 in the store, without Spark: every attempt of a version is published
under its own id and stays loadable by it, loads without an id are refused where the id matters,
ids that are not ours never become paths, the change feed follows the named attempt's chain, and
garbage collection keeps every attempt of a retained version (judged by the independent referee)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import referee
from backend_support import changes, commit, make_backend, state_of
from pystatestore.reading.checkpoint import open_checkpoint
from pystatestore.store.errors import CheckpointDamagedError, CheckpointMissingError, StoreConfigError
from pystatestore.tools.verification import verify_checkpoint

# The rocksdb backend in both commit modes, and the memory backend.
KINDS = [("rocksdb", "changelog"), ("rocksdb", "snapshot"), ("memory", None)]


def backend_for(kind: tuple[str, str | None], store: Path, local: Path, **kwargs):  # noqa: ANN201
    name, mode = kind
    return make_backend(name, store, local, mode=mode, checkpoint_ids=True, **kwargs)


def attempt_files(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "manifests").iterdir())


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: "-".join(filter(None, k)))
def test_every_attempt_of_a_version_stays_loadable_by_its_id(kind: tuple[str, str | None], tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = backend_for(kind, store, tmp_path / "w1")
    v1 = commit(b, 0, changes({b"a": b"1"}), "t1")
    a = commit(b, 1, changes({b"b": b"2"}), "t2.0", v1.manifest_id)
    c = commit(b, 1, changes({b"c": b"3"}, [b"a"]), "t2.1", v1.manifest_id)  # a retry, committed last
    # Spark's commit log names the first attempt: version 3 is built on it, after the other one.
    v3 = commit(b, 2, changes({b"d": b"4"}), "t3", a.manifest_id)
    assert attempt_files(store) == sorted(f"{r.version}-{r.manifest_id}.json" for r in (v1, a, c, v3)), (
        "each attempt has its own manifest, and no version has an unnamed one"
    )
    for path in (store / "manifests").iterdir():
        doc = json.loads(path.read_bytes())
        assert (
            path.name == f"{doc['version']}-{doc['checkpoint_id']}.json" and doc["checkpoint_id"] == doc["manifest_id"]
        )
    b.close()
    fresh = backend_for(kind, store, tmp_path / "w2")  # a restart elsewhere: nothing cached, no local copies
    assert state_of(fresh, 2, a.manifest_id) == {b"a": b"1", b"b": b"2"}
    assert state_of(fresh, 2, c.manifest_id) == {b"c": b"3"}
    assert state_of(fresh, 3, v3.manifest_id) == {b"a": b"1", b"b": b"2", b"d": b"4"}
    assert state_of(fresh, 2, a.manifest_id) == {b"a": b"1", b"b": b"2"}, "back from the other attempt"
    # A version with one attempt still loads without an id (the first batch's version 0 has none).
    assert state_of(fresh, 1) == {b"a": b"1"}
    with pytest.raises(StoreConfigError, match="2 attempts") as e:
        state_of(fresh, 2)
    assert a.manifest_id in e.value.problem and "commit log" in str(e.value)
    fresh.close()
    verdict = referee.judge_store(store, now=1e12)
    assert not verdict.lost, verdict.lost


@pytest.mark.parametrize("kind", KINDS[::2], ids=lambda k: "-".join(filter(None, k)))
def test_ids_that_are_not_ours_never_become_paths(kind: tuple[str, str | None], tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = backend_for(kind, store, tmp_path / "w")
    v1 = commit(b, 0, changes({b"a": b"1"}), "t1")
    (tmp_path / "1-x.json").write_text("{}")  # what a path in an id would reach
    before = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    for forged in ("../../1-x", "../manifests/1", v1.manifest_id.upper(), v1.manifest_id + "0", "a/b", ""):
        if not forged:
            continue
        with pytest.raises(StoreConfigError, match="not one pystatestore writes") as e:
            state_of(b, 1, forged)
        assert "commit log" in str(e.value)
    unknown = "0" * 32
    with pytest.raises(CheckpointMissingError) as missing:
        state_of(b, 1, unknown)
    assert missing.value.file == f"manifests/1-{unknown}.json" and "minBatchesToRetain" in str(missing.value)
    # A manifest copied under another attempt's name is refused, not read as that attempt.
    shutil.copy(store / "manifests" / f"1-{v1.manifest_id}.json", store / "manifests" / f"1-{unknown}.json")
    with pytest.raises(CheckpointDamagedError, match="not the attempt"):
        state_of(b, 1, unknown)
    os.remove(store / "manifests" / f"1-{unknown}.json")
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == before


def test_the_change_feed_follows_the_chain_of_the_named_attempt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", mode="changelog", checkpoint_ids=True)
    v1 = commit(b, 0, changes({b"a": b"1"}), "t1")
    lost = commit(b, 1, changes({b"lost": b"x"}), "t2.0", v1.manifest_id)
    kept = commit(b, 1, changes({b"b": b"2"}), "t2.1", v1.manifest_id)
    v3 = commit(b, 2, changes({b"c": b"3"}), "t3", kept.manifest_id)
    feed = {v: batch.column("key").to_pylist() for v, batch in b.changes(1, 3, v3.manifest_id)}
    assert feed == {1: [b"a"], 2: [b"b"], 3: [b"c"]}
    on_lost = {v: batch.column("key").to_pylist() for v, batch in b.changes(2, 2, lost.manifest_id)}
    assert on_lost == {2: [b"lost"]}
    with pytest.raises(StoreConfigError, match="2 attempts"):
        list(b.changes(1, 2))  # which attempt of version 2 is in Spark's commit log, not in the store


@pytest.mark.parametrize("mode", ["changelog", "snapshot"])
def test_gc_keeps_every_attempt_of_the_retained_versions(mode: str, tmp_path: Path) -> None:
    """Two attempts at versions 3 and 7; retention keeps 3 versions (5..8 after 8 commits). What GC
    leaves is judged by the referee, which reads the files itself: every retained attempt's chain is
    whole, and nothing else (beyond the grace) is left."""
    store = tmp_path / "store"
    # Nothing stored inside manifests: every attempt's changes and snapshot files are files GC could lose.
    files = {"inlineThresholdBytes": "0", "compactSnapshotMaxBytes": "0"}
    b = make_backend(
        "rocksdb", store, tmp_path / "w", mode=mode, checkpoint_ids=True, retain=3, grace=10, options=files
    )
    now = [1_000_000.0]
    b.clock = lambda: now[0]
    ids: dict[int, list[str]] = {0: [""]}
    for v in range(1, 9):
        base_id = ids[v - 1][0]
        attempts = 2 if v in (3, 7) else 1
        for i in range(attempts):
            r = commit(b, v - 1, changes({f"k{v}".encode(): f"{v}.{i}".encode()}), f"t{v}.{i}", base_id or None)
            ids.setdefault(v, []).append(r.manifest_id)
        if mode == "changelog" and v % 3 == 0:
            job = b.prepare_materialization(force=True)
            if job is not None:
                b.finish_materialization(job)
                b.complete_materialization(job)
    for f in store.rglob("*"):
        os.utime(f, (now[0] - 100, now[0] - 100))  # every file past the grace
    now[0] += 1
    b.maintenance(now[0])
    # Versions 5..8 are retained. In changelog mode version 5's chain goes back through attempt 0 of
    # version 3 (version 4 was built on it; maintenance snapshotted attempt 1, the one the local DB
    # held) to version 1; attempt 1 of version 3 is no one's. Snapshot commits need no chain.
    expected = {(v, i) for v in range(5, 9) for i in range(len(ids[v]))}
    if mode == "changelog":
        expected |= {(1, 0), (2, 0), (3, 0), (4, 0)}
    assert attempt_files(store) == sorted(f"{v}-{ids[v][i]}.json" for v, i in expected)
    verdict = referee.judge_store(store, min_batches_to_retain=3, now=now[0], grace_seconds=10, in_flight_seconds=0)
    assert not verdict.lost, verdict.lost
    assert not verdict.orphans, verdict.orphans
    b.close()
    assert any((store / d).iterdir() for d in ("shared", "changelog") if (store / d).exists())
    fresh = make_backend("rocksdb", store, tmp_path / "w2", mode=mode, checkpoint_ids=True)
    for i, mid in enumerate(ids[7]):
        assert state_of(fresh, 7, mid)[b"k7"] == f"7.{i}".encode()


def test_verify_checks_each_attempt_of_a_version_the_commit_log_does_not_name(tmp_path: Path) -> None:
    """Spark writes its commit log after the stores commit, so after a crash a version may have
    several attempts and no entry naming one (Spark runs the batch again): `verify` checks each,
    and names the one that is damaged, rather than refusing the version as ambiguous."""
    ckpt = tmp_path / "ckpt"
    b = backend_for(("rocksdb", "changelog"), ckpt / "state" / "0" / "1", tmp_path / "w")
    v1 = commit(b, 0, changes({b"a": b"1"}), "t1")
    first = commit(b, 1, changes({b"b": b"2"}), "t2.0", v1.manifest_id)
    commit(b, 1, changes({b"c": b"3"}), "t2.1", v1.manifest_id)
    b.close()
    (ckpt / "offsets").mkdir()
    (ckpt / "commits").mkdir()
    (ckpt / "metadata").write_text('{"id":"v2"}\n')
    (ckpt / "offsets" / "0").write_text("v1\n{}\n{}\n")
    (ckpt / "offsets" / "1").write_text("v1\n{}\n{}\n")  # batch 1 planned, its commit log entry lost
    ids = json.dumps({"nextBatchWatermarkMs": 0, "stateUniqueIds": {"0": [[], [v1.manifest_id]]}})
    (ckpt / "commits" / "0").write_text(f"v1\n{ids}\n")
    report = verify_checkpoint(open_checkpoint(str(ckpt)), deep=True)
    assert report.problems == [] and report.manifests == 3
    (ckpt / "state" / "0" / "1" / "manifests" / f"2-{first.manifest_id}.json").write_text("{")
    report = verify_checkpoint(open_checkpoint(str(ckpt)), deep=True)
    assert [(p.version, first.manifest_id in str(p.file)) for p in report.problems] == [(2, True)]
