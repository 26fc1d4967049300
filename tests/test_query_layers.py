"""A followed store's versions served as a restored base with the changes after it held in memory
(queryable/layers.py, decision 0046). The referee is the input: the puts and deletes this test
committed, version by version, applied to a plain dict. Every version a follower opens, layered or
restored, in this process or through the restore process, must answer every key, a batch of keys
and a prefix scan as that dict says; and a version the layers cannot stand for (another attempt of
the served version, past the layer bounds) is restored instead."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from backend_support import changes, commit, make_backend, materialize_if_due
from pystatestore.queryable import layers
from pystatestore.queryable.layers import LayerBudget, ViewAt, changes_since
from pystatestore.queryable.restorer import ProcessFollower, RestoreProcess
from pystatestore.queryable.versions import StoreFollower
from pystatestore.reading.checkpoint import StoreLocation
from pystatestore.reading.store_reader import StoreReader

VERSIONS = 14
KEYS = 300


def write_store(store: Path, work: Path, options: dict[str, str], min_deltas: int = 4) -> dict[int, dict[bytes, bytes]]:
    """Commits VERSIONS versions of puts and deletes (a snapshot due every `min_deltas`); returns
    each version's state as the input implies it."""
    b = make_backend("rocksdb", store, work, min_deltas=min_deltas, options=options)
    rnd = random.Random(11)
    state: dict[bytes, bytes] = {}
    states = {}
    for v in range(1, VERSIONS + 1):
        puts = {f"k{rnd.randrange(KEYS)}".encode(): rnd.randbytes(20) for _ in range(60)}
        deletes = [k for k in rnd.sample(sorted(state), min(15, len(state))) if k not in puts]
        after = {k: val for k, val in (state | puts).items() if k not in deletes}
        commit(b, v - 1, changes(puts, deletes), f"t{v}", num_keys=len(after))
        state = states[v] = after
        materialize_if_due(b)
    return states


def follower(kind: str, location: StoreLocation, scratch: Path) -> tuple[Any, RestoreProcess | None]:
    scratch.mkdir(exist_ok=True)
    if kind == "process":
        restores = RestoreProcess(str(scratch))
        return ProcessFollower(location, restores, str(scratch)), restores
    return StoreFollower(location, str(scratch)), None


def answers_as_input(opened: Any, expected: dict[bytes, bytes]) -> None:
    asked = [f"k{i}".encode() for i in range(KEYS)] + [b"absent"]  # every key ever written, and one never
    assert [opened.get(k) for k in asked] == [expected.get(k) for k in asked]
    assert opened.get_many(asked) == [expected.get(k) for k in asked]
    assert list(opened.items()) == sorted(expected.items())
    assert list(opened.items(b"k1")) == sorted((k, v) for k, v in expected.items() if k.startswith(b"k1"))


@pytest.mark.parametrize("kind", ["thread", "process"])
@pytest.mark.parametrize("segments", ["inline", "files"])
def test_every_version_answers_as_the_input_says_layered_or_restored(tmp_path: Path, kind: str, segments: str) -> None:
    options = {"inlineThresholdBytes": "0", "compactSnapshotMaxBytes": "0"} if segments == "files" else {}
    states = write_store(tmp_path / "store", tmp_path / "w", options)
    location = StoreLocation(0, 1, "default", f"file:{tmp_path / 'store'}")
    f, restores = follower(kind, location, tmp_path / "scratch")
    depths = []
    previous = None
    try:
        for v in range(1, VERSIONS + 1):
            opened = f.open(v)
            depths.append(len(opened.layers))
            answers_as_input(opened, states[v])
            if previous is not None:
                answers_as_input(previous, states[v - 1])  # still whole after the next was served on it
                previous.release()
            previous = opened
        previous.release()
    finally:
        f.close()
        if restores is not None:
            restores.close()
    # Served from memory between snapshots; restored again at each snapshot whose version's changes
    # went with it (files; changes inside manifests stay, so those versions layer on).
    assert max(depths) >= 2 and (segments == "inline" or depths.count(0) >= 3), depths


def test_another_attempt_of_the_served_version_is_not_built_on(tmp_path: Path) -> None:
    states = write_store(tmp_path / "store", tmp_path / "w", {})
    location = StoreLocation(0, 1, "default", f"file:{tmp_path / 'store'}")
    with StoreReader(location, str(tmp_path)) as reader:
        v = next(v for v in range(2, VERSIONS) if reader.manifest(v).is_changelog)
        served = reader.manifest(v - 1).manifest_id
        assert changes_since(reader, v, None, ViewAt(v - 1, served)) is not None
        assert changes_since(reader, v, None, ViewAt(v - 1, "another-attempt")) is None
        assert changes_since(reader, v, None, ViewAt(v - 1, served, layers=layers.MAX_LAYERS)) is None
    assert states


def test_the_layer_bounds_restore_the_next_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At most MAX_LAYERS versions, and MAX_LAYER_BYTES of changes, held over one base."""
    states = write_store(tmp_path / "store", tmp_path / "w", {}, min_deltas=1000)  # no snapshot after 1
    location = StoreLocation(0, 1, "default", f"file:{tmp_path / 'store'}")
    for bound, value in (("MAX_LAYERS", 2), ("MAX_LAYER_BYTES", 2000)):
        monkeypatch.setattr(layers, bound, value)
        (tmp_path / bound).mkdir()
        f = StoreFollower(location, str(tmp_path / bound))
        depths = []
        try:
            for v in range(1, VERSIONS + 1):
                opened = f.open(v)
                depths.append(len(opened.layers))
                answers_as_input(opened, states[v])
                opened.release()
        finally:
            f.close()
        monkeypatch.undo()
        # Each version's changes are about 1,500 bytes: 2,000 hold one version's.
        assert max(depths) == (2 if bound == "MAX_LAYERS" else 1) and depths.count(0) >= 5, (bound, depths)


def test_a_follower_that_skips_versions_layers_all_they_changed_within_the_bounds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower asked for a version several commits ahead (it polled late) takes every version's
    changes in between in one step, and restores instead when they would pass MAX_LAYERS."""
    states = write_store(tmp_path / "store", tmp_path / "w", {}, min_deltas=1000)
    location = StoreLocation(0, 1, "default", f"file:{tmp_path / 'store'}")
    for bound, depth in ((16, 5), (4, 0)):
        monkeypatch.setattr(layers, "MAX_LAYERS", bound)
        f = StoreFollower(location, str(tmp_path))
        try:
            f.open(1).release()
            opened = f.open(6)
            assert len(opened.layers) == depth, bound
            answers_as_input(opened, states[6])
            opened.release()
        finally:
            f.close()


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_followers_of_one_client_share_one_layer_budget(tmp_path: Path, kind: str) -> None:
    """Two followers (a client following two stores) under a budget that holds about three
    versions' changes: together they never hold more, each restores when its next version would
    pass it, and every answer stays as the input says."""
    states = write_store(tmp_path / "store", tmp_path / "w", {}, min_deltas=1000)
    location = StoreLocation(0, 1, "default", f"file:{tmp_path / 'store'}")
    budget = LayerBudget(5000)  # each version's changes are about 1,500 bytes
    (tmp_path / "scratch").mkdir()
    restores = RestoreProcess(str(tmp_path / "scratch")) if kind == "process" else None
    followers = [
        ProcessFollower(location, restores, str(tmp_path / "scratch"), budget=budget)
        if restores is not None
        else StoreFollower(location, str(tmp_path / "scratch"), budget=budget)
        for _ in range(2)
    ]
    depths: list[int] = []
    try:
        for v in range(1, VERSIONS + 1):
            for f in followers:
                opened = f.open(v)
                depths.append(len(opened.layers))
                answers_as_input(opened, states[v])
                opened.release()
                assert budget.held() <= budget.limit
    finally:
        for f in followers:
            f.close()
        if restores is not None:
            restores.close()
    assert budget.held() == 0  # closed followers hold nothing
    assert max(depths) >= 1 and depths.count(0) >= 6, depths  # layered, and restored at the budget
