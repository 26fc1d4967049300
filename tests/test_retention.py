"""Retention is a pure function of manifests and a listing (DESIGN §4)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pystatestore.store.backends.cleanup import removal_rounds
from pystatestore.store.leases import leased_bases
from pystatestore.store.manifest import KIND_CHANGELOG, KIND_SNAPSHOT, Manifest, snapshot_path
from pystatestore.store.remote import RemoteFile
from pystatestore.store.retention import plan_retention

NOW = 1_000_000.0
GRACE = 600.0


def listing_for(versions: dict[int, list[str]], extra: list[tuple[str, float]] = ()) -> list[RemoteFile]:
    files = [RemoteFile(f"manifests/{v}.json", 10, NOW - 5000) for v in versions]
    files += [RemoteFile(p, 10, NOW - 5000) for refs in versions.values() for p in refs]
    files += [RemoteFile(p, 10, mtime) for p, mtime in extra]
    return files


def test_keeps_newest_and_retain_before_it() -> None:
    versions = {v: [f"private/{v}-a/snapshot.arrow"] for v in range(1, 11)}
    plan = plan_retention(
        listing_for(versions), versions, min_versions_to_retain=3, now=NOW, orphan_grace_seconds=GRACE
    )
    assert plan.lowest_retained == 7
    assert plan.kept_versions == (7, 8, 9, 10)
    assert plan.delete_manifests == tuple(sorted(f"manifests/{v}.json" for v in range(1, 7)))
    assert set(plan.delete_files) == {f"private/{v}-a/snapshot.arrow" for v in range(1, 7)}


def test_file_shared_with_a_retained_version_is_kept() -> None:
    versions = {1: ["shared/x.sst", "private/1/M"], 2: ["shared/x.sst", "private/2/M"], 3: ["private/3/M"]}
    plan = plan_retention(
        listing_for({k: v for k, v in versions.items()}),
        versions,
        min_versions_to_retain=1,
        now=NOW,
        orphan_grace_seconds=GRACE,
    )
    assert plan.kept_versions == (2, 3)
    assert "shared/x.sst" not in plan.delete_files
    assert "private/1/M" in plan.delete_files


def test_orphans_wait_for_the_grace_period() -> None:
    versions = {1: ["private/1/M"]}
    young, old = "private/2-inflight/M", "private/2-crashed/M"
    listing = listing_for(versions, [(young, NOW - 10), (old, NOW - GRACE - 1)])
    plan = plan_retention(listing, versions, min_versions_to_retain=5, now=NOW, orphan_grace_seconds=GRACE)
    assert young not in plan.delete_files
    assert old in plan.delete_files
    assert "private/1/M" not in plan.delete_files


def test_unreadable_retained_manifest_blocks_data_and_manifest_deletion() -> None:
    """What an unreadable retained version needs is unknown: its data files, and (a changelog
    version) the manifests of its chain, however old."""
    versions: dict[int, list[str] | None] = {1: ["private/1/M"], 2: None, 3: ["private/3/M"]}
    listing = listing_for({1: ["private/1/M"], 2: [], 3: ["private/3/M"]}, [("private/9/orphan", 0.0)])
    plan = plan_retention(listing, versions, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE)
    assert plan.delete_files == ()
    assert plan.delete_manifests == ()


def test_a_retained_chain_keeps_its_old_manifests_and_changes() -> None:
    """Version 4 is a changelog on 3 on 2 (a snapshot): with retention 0, manifests 2 and 3 and
    their files stay because 4 needs them; version 1 goes."""
    needs_4 = ["manifests/2.json", "shared/2.sst", "manifests/3.json", "changelog/3-a.changes", "changelog/4-b.changes"]
    versions: dict[int, list[str] | None] = {
        1: ["shared/1.sst"],
        2: ["shared/2.sst"],
        3: ["changelog/3-a.changes"],
        4: needs_4,
    }
    files = {1: ["shared/1.sst"], 2: ["shared/2.sst"], 3: ["changelog/3-a.changes"], 4: ["changelog/4-b.changes"]}
    plan = plan_retention(listing_for(files), versions, min_versions_to_retain=0, now=NOW, orphan_grace_seconds=GRACE)
    assert plan.delete_manifests == ("manifests/1.json",)
    assert plan.delete_files == ("shared/1.sst",)


def test_the_version_committed_last_is_kept_whatever_its_number() -> None:
    """Spark re-ran batches from the start: version 1 was committed again (its manifest written
    last) while versions up to 4 exist. The next commit builds on it, so it stays with its files,
    however old; the other versions below the lowest retained one go as usual."""
    versions = {
        1: ["shared/1b.sst"],
        2: ["shared/2.sst"],
        3: ["shared/3.sst"],
        4: ["shared/4.sst"],
        5: ["shared/5.sst"],
    }
    listing = [
        f if f.path != "manifests/1.json" else RemoteFile(f.path, f.size, NOW - GRACE - 1)
        for f in listing_for(versions)
    ]
    plan = plan_retention(listing, versions, min_versions_to_retain=2, now=NOW, orphan_grace_seconds=GRACE)
    assert plan.lowest_retained == 3
    assert plan.kept_versions == (1, 3, 4, 5)
    assert plan.delete_manifests == ("manifests/2.json",)
    assert plan.delete_files == ("shared/2.sst",)


def test_a_version_a_live_commit_builds_on_is_kept_with_its_chain() -> None:
    """Spark re-runs batch 3 on a fresh executor: its commit pinned version 2 (a changelog on 1),
    below the retained versions. Version 2 stays, with the manifest and files of its chain."""
    versions: dict[int, list[str] | None] = {
        1: ["shared/1.sst"],
        2: ["manifests/1.json", "shared/1.sst", "changelog/2-a.changes"],
        3: ["changelog/3-a.changes"],
        4: ["shared/4.sst"],
        5: ["shared/5.sst"],
    }
    files = {1: ["shared/1.sst"], 2: ["changelog/2-a.changes"], 3: ["changelog/3-a.changes"], 4: [], 5: []}
    files[4], files[5] = ["shared/4.sst"], ["shared/5.sst"]
    listing = listing_for(files)
    unpinned = plan_retention(listing, versions, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE)
    assert "manifests/2.json" in unpinned.delete_manifests, "the scenario needs version 2 below the retained ones"
    plan = plan_retention(listing, versions, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE, pinned=[2])
    assert plan.kept_versions == (2, 4, 5)
    assert plan.delete_manifests == ("manifests/3.json",)
    assert plan.delete_files == ("changelog/3-a.changes",)


def test_only_lease_bodies_naming_a_base_pin_it() -> None:
    bodies = [
        b'{"version": 4, "token": "t", "at": 1.0, "base_version": 3}',
        b'{"version": 9, "token": "u", "at": 1.0}',  # a slow commit on the newest version
        b'{"base_version": true}',
        b'{"base_version": -1}',
        b'{"base_version": "2"}',
    ]
    assert leased_bases(bodies, versions=range(1, 10)) == {3}


def test_a_lease_that_cannot_be_parsed_pins_every_version() -> None:
    """It may name any base (damaged, or written by a release this one cannot read): no manifest
    may go while it lives."""
    for body in (b"not json", b"[1, 2]", b'{"base_version": 3'):
        assert leased_bases([b'{"base_version": 3}', body], versions=range(1, 10)) == set(range(1, 10)), body


def test_without_manifests_only_old_orphans_go() -> None:
    """A first commit that crashed before its manifest leaves orphans; they go after the grace period."""
    listing = [RemoteFile("private/1-a/CURRENT", 1, NOW - GRACE - 1), RemoteFile("shared/x.sst", 1, NOW - 5)]
    plan = plan_retention(listing, {}, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE)
    assert plan.lowest_retained is None
    assert plan.delete_files == ("private/1-a/CURRENT",)
    assert plan.delete_manifests == ()


def test_stale_manifest_temporaries_are_cleaned_after_grace() -> None:
    versions = {1: ["private/1/M"]}
    listing = listing_for(versions, [("manifests/.tmp-abc", NOW - GRACE - 5), ("manifests/.tmp-new", NOW)])
    plan = plan_retention(listing, versions, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE)
    assert "manifests/.tmp-abc" in plan.delete_files
    assert "manifests/.tmp-new" not in plan.delete_files


@settings(max_examples=300, deadline=None)
@given(
    refs=st.dictionaries(
        st.integers(1, 40),
        st.lists(st.sampled_from([f"shared/{i}.sst" for i in range(12)]), max_size=5),
        min_size=1,
        max_size=15,
    ),
    retain=st.integers(0, 10),
)
def test_never_deletes_what_a_retained_version_references(refs: dict[int, list[str]], retain: int) -> None:
    plan = plan_retention(listing_for(refs), refs, min_versions_to_retain=retain, now=NOW, orphan_grace_seconds=GRACE)
    # Spark's rule, stated independently: the newest version and the `retain` versions before it.
    lowest = max(refs) - retain
    assert plan.lowest_retained == lowest
    needed = {p for v, r in refs.items() if v >= lowest for p in r}
    assert needed.isdisjoint(plan.delete_files)
    assert max(refs) in plan.kept_versions
    # Everything no retained version needs is gone (all files here are older than the grace period).
    all_data = {p for r in refs.values() for p in r}
    assert set(plan.delete_files) == all_data - needed


TOKEN_A, TOKEN_B = "a" * 32, "b" * 32


def test_orphans_of_an_attempt_holding_a_lease_are_kept_however_old() -> None:
    versions = {1: ["private/1/M"]}
    slow = [(f"shared/{TOKEN_A}-000009.sst", 0.0), (f"private/2-{TOKEN_A}/CURRENT", 0.0)]
    dead = [(f"shared/{TOKEN_B}-000009.sst", 0.0)]
    lease = [(f"leases/{TOKEN_A}", NOW - GRACE / 4), (f"leases/{TOKEN_B}", NOW - GRACE - 1)]
    plan = plan_retention(
        listing_for(versions, slow + dead + lease),
        versions,
        min_versions_to_retain=5,
        now=NOW,
        orphan_grace_seconds=GRACE,
    )
    assert not {p for p, _ in slow} & set(plan.delete_files)
    assert f"shared/{TOKEN_B}-000009.sst" in plan.delete_files
    assert f"leases/{TOKEN_B}" in plan.delete_files and f"leases/{TOKEN_A}" not in plan.delete_files


def test_attempt_directories_go_when_published_or_dead() -> None:
    versions = {1: [f"private/1-{TOKEN_A}/M"], 2: ["private/2-x/M"]}
    c, d = "c" * 32, "d" * 32
    dirs = [
        RemoteFile(f"private/1-{TOKEN_A}", 0, NOW),  # published (young mtime: its files were just deleted)
        RemoteFile(f"private/3-{TOKEN_B}", 0, NOW - 5),  # in flight, no lease yet: young
        RemoteFile(f"private/3-{c}", 0, NOW - GRACE - 1),  # crashed long ago
        RemoteFile(f"private/3-{d}", 0, NOW - GRACE - 1),  # slow, holds a lease
    ]
    listing = listing_for(versions, [(f"leases/{d}", NOW - 1)])
    plan = plan_retention(listing, versions, min_versions_to_retain=5, now=NOW, orphan_grace_seconds=GRACE, dirs=dirs)
    assert plan.delete_dirs == (f"private/1-{TOKEN_A}", f"private/3-{c}")


def test_a_set_aside_manifest_stays_while_its_version_has_no_final_manifest() -> None:
    versions = {1: ["private/1/M"], 2: ["private/2/M"], 3: ["private/3/M"]}
    listing = [
        f
        for f in listing_for(versions)
        if f.path != "manifests/2.json"  # crash between the two renames
    ] + [
        RemoteFile("manifests/.replaced-2.json-1f", 10, NOW - 5000),
        RemoteFile("manifests/.replaced-3.json-2e", 10, NOW - 5000),  # 3 has its final manifest again
        RemoteFile("manifests/.replaced-3.json-3d", 10, NOW - 1),  # ...but this one is still young
    ]
    plan = plan_retention(listing, versions, min_versions_to_retain=5, now=NOW, orphan_grace_seconds=GRACE)
    assert "manifests/.replaced-2.json-1f" not in plan.delete_files
    assert "manifests/.replaced-3.json-2e" in plan.delete_files
    assert "manifests/.replaced-3.json-3d" not in plan.delete_files
    assert "private/2/M" not in plan.delete_files


def chain_manifest(version: int, changelog: bool, manifest_id: str) -> Manifest:
    return Manifest(
        store={},
        version=version,
        base_version=version - 1,
        backend="rocksdb",
        key_schema="k",
        value_schema="v",
        num_keys=0,
        attempt_id=f"a{version}",
        manifest_id=manifest_id,
        kind=KIND_CHANGELOG if changelog else KIND_SNAPSHOT,
    )


def test_manifests_are_removed_in_rounds_down_each_chain() -> None:
    """Versions 1-9 of changelog commits, snapshots of 3 and 6: the chains 9-6, 5-3 and 2-1 come
    down a round at a time, side by side; a version whose manifest was not read reaches its base."""
    read: dict[str, Manifest] = {}
    for v in range(1, 10):
        read[f"manifests/{v}.json"] = chain_manifest(v, True, f"id{v}")
    for v in (3, 6):
        read[snapshot_path(v, f"id{v}")] = chain_manifest(v, False, f"id{v}")
    rounds = removal_rounds([f"manifests/{v}.json" for v in range(1, 10)], read)
    as_versions = [sorted(int(r.split("/")[1].split(".")[0]) for r in group) for group in rounds]
    assert as_versions == [[2, 5, 9], [1, 4, 8], [3, 7], [6]]
    del read["manifests/5.json"]  # unread: taken to reach version 4, as it does
    del read[snapshot_path(3, "id3")]  # no snapshot: version 3 reaches version 2
    rounds = removal_rounds([f"manifests/{v}.json" for v in range(1, 10)], read)
    as_versions = [sorted(int(r.split("/")[1].split(".")[0]) for r in group) for group in rounds]
    assert as_versions == [[5, 9], [4, 8], [3, 7], [2, 6], [1]]


@given(
    st.lists(st.tuples(st.booleans(), st.booleans(), st.booleans(), st.integers(1, 2)), min_size=1, max_size=12),
)
@settings(max_examples=200, deadline=None)
def test_no_round_removes_a_manifest_another_in_it_or_after_it_reaches(shape: list[tuple]) -> None:
    """Whatever the chains: each manifest is removed once, and a manifest whose chain reaches the
    version below (a changelog manifest without a snapshot, or one not read) is removed in an
    earlier round than every manifest of that version."""
    read: dict[str, Manifest] = {}
    doomed: list[str] = []
    reaches: dict[str, bool] = {}
    for i, (changelog, snapshotted, known, attempts) in enumerate(shape):
        v = i + 1
        for a in range(attempts):
            rel = f"manifests/{v}-{a}.json"
            doomed.append(rel)
            if known:
                read[rel] = chain_manifest(v, changelog, f"{v}-{a}")
                if snapshotted:
                    read[snapshot_path(v, f"{v}-{a}")] = chain_manifest(v, False, f"{v}-{a}")
            reaches[rel] = not known or (changelog and not snapshotted)
    rounds = removal_rounds(doomed, read)
    placed = {rel: n for n, group in enumerate(rounds) for rel in group}
    assert sorted(r for group in rounds for r in group) == sorted(doomed)
    for rel in doomed:
        v = int(rel.split("/")[1].split("-")[0])
        if reaches[rel]:
            for other in doomed:
                if other.startswith(f"manifests/{v - 1}-"):
                    assert placed[rel] < placed[other], (rel, other, rounds)
