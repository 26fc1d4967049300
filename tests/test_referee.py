"""The independent referee (tests/referee.py) catches every kind of damage it is there to catch, on
checkpoints the product really wrote, and passes healthy ones of both commit modes and backends.
Then the product's garbage collection is judged by it."""

from __future__ import annotations

import ast
import base64
import json
import random
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import referee
from backend_support import MODES, changes, commit, make_backend, materialize_if_due

FAR_FUTURE = time.time() + 10 * 365 * 86400
TOKEN = "0123456789abcdef0123456789abcdef"


def write_store(store: Path, work: Path, *, mode: str = "changelog", versions: int = 6, **options: str) -> None:
    """A store the product wrote: `versions` commits of 60 keys, a snapshot every 3 versions."""
    b = make_backend("rocksdb", store, work, retain=100, min_deltas=3, mode=mode, options=dict(options))
    rnd = random.Random(7)
    try:
        for v in range(1, versions + 1):
            commit(
                b, v - 1, changes({f"k{rnd.randrange(200)}".encode(): rnd.randbytes(40) for _ in range(60)}), f"t{v}"
            )
            materialize_if_due(b)
    finally:
        b.close()


def manifest_doc(store: Path, version: int) -> dict:
    return json.loads((store / "manifests" / f"{version}.json").read_text())


def test_the_referee_imports_nothing_of_the_product() -> None:
    tree = ast.parse(Path(referee.__file__).read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in (n.names if isinstance(n, ast.Import) else [n])
    }
    assert not [m for m in imported if m.startswith(("pystatestore", "backend_support", "spark_support"))], imported


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("inline", ["16384", "0"])
def test_a_healthy_store_is_judged_healthy(tmp_path: Path, mode: str, inline: str) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", mode=mode, inlineThresholdBytes=inline)
    verdict = referee.judge_store(store, min_batches_to_retain=100, now=FAR_FUTURE)
    assert verdict.versions == [1, 2, 3, 4, 5, 6]
    assert verdict.lost == [] and verdict.orphans == [], verdict
    assert verdict.files_checked + verdict.inline_checked > 0


def test_a_missing_file_is_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", inlineThresholdBytes="0")
    victim = manifest_doc(store, 5)["changes"]["path"]
    (store / victim).unlink()
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any(victim in p and "missing" in p for p in lost), lost


def test_a_truncated_file_is_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", mode="snapshot", inlineThresholdBytes="0")
    victim = store / next(r["path"] for r in manifest_doc(store, 6)["shared"].values() if "path" in r)
    victim.write_bytes(victim.read_bytes()[:-1])
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any("CRC-32 differs" in p for p in lost), lost


def test_corrupted_inline_data_is_lost(tmp_path: Path) -> None:
    """Valid base64, wrong bytes: only reading the data stored inside the manifest tells."""
    store = tmp_path / "store"
    write_store(store, tmp_path / "w")
    doc = manifest_doc(store, 2)
    data = bytearray(base64.b64decode(doc["changes"]["data"]))
    data[len(data) // 2] ^= 0xFF
    doc["changes"]["data"] = base64.b64encode(bytes(data)).decode()
    (store / "manifests" / "2.json").write_text(json.dumps(doc))
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any(p.startswith("manifests/2.json: changes stored inside") for p in lost), lost


def test_a_missing_chain_manifest_is_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", versions=2)  # no snapshot yet: 2 chains back to 1
    (store / "manifests" / "1.json").unlink()
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any(p.startswith("manifests/1.json (missing; the chain of version 2") for p in lost), lost


def test_a_chain_on_another_attempt_is_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", versions=2)
    doc = manifest_doc(store, 1)
    doc["manifest_id"] = "f" * 32
    (store / "manifests" / "1.json").write_text(json.dumps(doc))
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any("the chain of version 2 breaks" in p for p in lost), lost


def test_a_required_version_without_a_manifest_is_lost(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", versions=3)
    lost = referee.judge_store(store, required=[4], now=FAR_FUTURE).lost
    assert lost == ["manifests/4.json (missing; version 4 must be restorable)"]


def test_orphans_left_behind_are_named(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", inlineThresholdBytes="0")
    (store / "shared").mkdir(exist_ok=True)
    stray = store / "shared" / f"{TOKEN}-000001.sst"
    stray.write_bytes(b"nobody's")
    (store / "leases").mkdir(exist_ok=True)
    (store / "leases" / TOKEN).write_text("{}")
    verdict = referee.judge_store(store, min_batches_to_retain=1, now=FAR_FUTURE)
    orphans = "\n".join(verdict.orphans)
    assert f"shared/{TOKEN}-000001.sst (no manifest or snapshot names it)" in orphans
    assert f"leases/{TOKEN} (an expired lease)" in orphans
    # versions 1-4 are below the retained 5 and 6, whose chains end at the snapshot of 6 and at 3
    assert "manifests/1.json (version 1: no retained version needs it)" in orphans
    assert "manifests/3.json" not in orphans and "manifests/5.json" not in orphans
    # young files are never orphans: they may belong to a commit in flight
    young = referee.judge_store(store, min_batches_to_retain=1, now=time.time(), grace_seconds=600)
    assert not [o for o in young.orphans if TOKEN in o], young.orphans


def test_a_path_outside_the_store_is_lost_and_never_read(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(store, tmp_path / "w", mode="snapshot", versions=1)
    doc = manifest_doc(store, 1)
    name = next(iter(doc["shared"]))
    doc["shared"][name] = {"path": "../../etc/passwd", "size": 1, "checksum": "crc32:00000000"}
    (store / "manifests" / "1.json").write_text(json.dumps(doc))
    lost = referee.judge_store(store, now=FAR_FUTURE).lost
    assert any("a path outside the store" in p for p in lost), lost


# -- the product's garbage collection, judged by the referee --------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    retain=st.integers(1, 4),
    min_deltas=st.integers(1, 4),
    batches=st.integers(3, 12),
    inline=st.sampled_from(["16384", "0"]),
    mode=st.sampled_from(MODES),
    seed=st.integers(0, 2**16),
)
def test_gc_leaves_exactly_what_the_referee_says_retained_versions_need(
    tmp_path_factory: pytest.TempPathFactory,
    retain: int,
    min_deltas: int,
    batches: int,
    inline: str,
    mode: str,
    seed: int,
) -> None:
    root = tmp_path_factory.mktemp("gc")
    store = root / "store"
    rnd = random.Random(seed)
    b = make_backend(
        "rocksdb",
        store,
        root / "w",
        retain=retain,
        min_deltas=min_deltas,
        mode=mode,
        options={"inlineThresholdBytes": inline},
    )
    try:
        for v in range(1, batches + 1):
            puts = {f"k{rnd.randrange(100)}".encode(): rnd.randbytes(30) for _ in range(20)}
            commit(b, v - 1, changes(puts), f"t{v}")
            materialize_if_due(b)
            if rnd.random() < 0.5:
                b.maintenance(now=time.time() + rnd.choice([0, 10_000]))
        b.maintenance(now=FAR_FUTURE)
    finally:
        b.close()
    verdict = referee.judge_store(store, min_batches_to_retain=retain, now=FAR_FUTURE)
    assert verdict.lost == [], verdict.lost
    assert verdict.orphans == [], verdict.orphans
    assert verdict.retained == list(range(max(1, batches - retain), batches + 1))
    present = set(referee.listing(store))
    assert present == verdict.needed, (sorted(present - verdict.needed), sorted(verdict.needed - present))


def test_gc_of_a_young_snapshot_keeps_the_chain_before_it(tmp_path: Path) -> None:
    """Right after a snapshot, GC keeps the chain back to the snapshot before it (restores that
    began earlier still walk it); the referee, knowing the same documented rule, finds no orphan
    while the snapshot is young and the orphans once it has settled."""
    store = tmp_path / "store"
    b = make_backend("rocksdb", store, tmp_path / "w", retain=1, min_deltas=2)
    try:
        for v in range(1, 9):
            commit(b, v - 1, changes({f"k{v}-{i}".encode(): b"x" * 50 for i in range(200)}), f"t{v}")
            materialize_if_due(b)
            b.maintenance()
    finally:
        b.close()
    now = time.time()
    young = referee.judge_store(store, min_batches_to_retain=1, now=now, grace_seconds=600)
    assert young.lost == [] and young.orphans == [], young
    settled = referee.judge_store(store, min_batches_to_retain=1, now=now + 10_000, grace_seconds=600)
    assert settled.lost == [] and settled.orphans, settled
