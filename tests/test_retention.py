"""Retention is a pure function of manifests and a listing (DESIGN §4)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pystatestore.remote import RemoteFile
from pystatestore.retention import lowest_retained_version, plan_retention

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


def test_unreadable_retained_manifest_blocks_data_deletion() -> None:
    versions: dict[int, list[str] | None] = {1: ["private/1/M"], 2: None, 3: ["private/3/M"]}
    listing = listing_for({1: ["private/1/M"], 2: [], 3: ["private/3/M"]}, [("private/9/orphan", 0.0)])
    plan = plan_retention(listing, versions, min_versions_to_retain=1, now=NOW, orphan_grace_seconds=GRACE)
    assert plan.delete_files == ()
    assert plan.delete_manifests == ("manifests/1.json",)


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
    lowest = lowest_retained_version(refs, retain)
    needed = {p for v, r in refs.items() if v >= lowest for p in r}
    assert needed.isdisjoint(plan.delete_files)
    assert max(refs) in plan.kept_versions
    # Everything no retained version needs is gone (all files here are older than the grace period).
    all_data = {p for r in refs.values() for p in r}
    assert set(plan.delete_files) == all_data - needed
