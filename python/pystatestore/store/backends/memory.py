"""The `memory` backend: versions as Python dicts, each commit a full Arrow snapshot plus manifest.

It is the reference backend: simple enough to trust, durable (any retained version reloads from
the checkpoint after a restart), but every commit rewrites the whole state. The rocksdb backend
makes commits incremental.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import pyarrow as pa

from .. import frames
from ..errors import CheckpointDamagedError
from ..manifest import FileRef, Manifest, checksum
from ..retention import RetentionPlan
from .base import StateBackend, log
from .context import CommitResult, LoadResult, elapsed_ms

SNAPSHOT_FILE = "snapshot.arrow"


class MemoryBackend(StateBackend):
    name = "memory"
    versions_in_memory = 2

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # version -> (pairs, manifest id of the attempt they came from)
        self._versions: OrderedDict[int, tuple[dict[bytes, bytes], str]] = OrderedDict()

    # -- reading -----------------------------------------------------------------------------
    def _read_verified(self, version: int, ref_name: str, manifest: Manifest) -> pa.Buffer:
        ref = manifest.private.get(ref_name)
        if ref is None:
            raise CheckpointDamagedError(
                f"manifest lists no {ref_name}", store=self.ctx.store_dir, version=version, file=manifest.path
            )
        data = self.remote.read_bytes(ref.path, version=version)
        if data.size != ref.size:
            raise CheckpointDamagedError(
                f"file has {data.size} bytes, the manifest says {ref.size}",
                store=self.ctx.store_dir,
                version=version,
                file=ref.path,
            )
        actual = checksum(data)
        if actual != ref.checksum:
            raise CheckpointDamagedError(
                f"checksum {actual} does not match the manifest's {ref.checksum}",
                store=self.ctx.store_dir,
                version=version,
                file=ref.path,
            )
        return data

    def _state(
        self, version: int, *, current: bool = False, checkpoint_id: str | None = None
    ) -> tuple[dict[bytes, bytes], int, str]:
        """The version's pairs, the bytes read from storage to get them, and its manifest id. With
        `current`, a cached version is used only if it is still the attempt the checkpoint holds;
        with `checkpoint_id` (format v2), only if it is that attempt."""
        if version == 0:
            return {}, 0, ""
        cached = self._versions.get(version)
        if checkpoint_id is not None and cached is not None and cached[1] == checkpoint_id:
            manifest = None  # an attempt's manifest is never replaced
        else:
            manifest = self.read_manifest(version, checkpoint_id) if current or cached is None else None
        if cached is not None and (manifest is None or cached[1] == manifest.manifest_id):
            self._versions.move_to_end(version)
            return cached[0], 0, cached[1]
        assert manifest is not None
        data = self._read_verified(version, SNAPSHOT_FILE, manifest)
        try:
            state = frames.buffer_to_state(data)
        except (pa.ArrowInvalid, ValueError) as e:
            raise CheckpointDamagedError(
                f"snapshot is not a valid Arrow stream ({e})",
                store=self.ctx.store_dir,
                version=version,
                file=manifest.private[SNAPSHOT_FILE].path,
            ) from None
        self._remember(version, state, manifest.manifest_id)
        return state, data.size, manifest.manifest_id

    def _remember(self, version: int, state: dict[bytes, bytes], manifest_id: str) -> None:
        self._versions[version] = (state, manifest_id)
        self._versions.move_to_end(version)
        while len(self._versions) > self.versions_in_memory:
            self._versions.popitem(last=False)

    def load(self, version: int, view_dir: str | None = None, checkpoint_id: str | None = None) -> LoadResult:
        state, read, manifest_id = self._state(version, current=True, checkpoint_id=checkpoint_id)
        return LoadResult(
            frames.state_to_buffer(state), len(state), read, "remote" if read else "memory", manifest_id=manifest_id
        )

    # -- writing -----------------------------------------------------------------------------
    def commit(
        self,
        base_version: int,
        changes: frames.Changes,
        attempt_id: str,
        base_manifest_id: str | None = None,
        *,
        num_keys: int | None = None,
        num_internal_keys: int = 0,  # no column families on this backend: always 0
        view_dir: str | None = None,
        empty_base: bool = False,
        durable_first: bool = False,
    ) -> CommitResult:
        version = base_version + 1
        timed: dict[str, int] = {}  # the manifest's commit_ms, as the rocksdb backend records it
        started = time.perf_counter()
        if empty_base:
            base, read = {}, 0
        else:
            base, read, base_id = self._state(
                base_version, current=True, checkpoint_id=self.attempt_for_lookup(base_manifest_id)
            )
            self.check_base(base_version, base_id, base_manifest_id)
        if read:
            timed["restoreMs"] = elapsed_ms(started)
        started = time.perf_counter()
        state = dict(base)  # the base stays intact for retries of this version
        frames.apply_changes(state, changes)
        if num_keys is not None and num_keys != len(state):
            # The JVM's count is derived from what it read; the dict is exact. A difference is a bug.
            log.warning(
                "store %s version %d: the JVM counted %d keys, the memory backend holds %d; recording %d",
                self.ctx.store_dir,
                version,
                num_keys,
                len(state),
                len(state),
            )
        snapshot = frames.state_to_buffer(state)
        timed["applyMs"] = elapsed_ms(started)
        with self.commit_attempt(version) as lease:
            rel = f"private/{version}-{lease.token}/{SNAPSHOT_FILE}"
            started = time.perf_counter()
            self.remote.write_bytes(rel, snapshot)
            timed["uploadMs"] = elapsed_ms(started)
            self.fault_point("commit:uploaded")
            manifest = self.new_manifest(version, len(state), attempt_id, private={SNAPSHOT_FILE: _ref(rel, snapshot)})
            manifest.commit_ms = timed
            body = manifest.to_json()
            lease.check_before_publish()
            self.remote.publish(manifest.path, body)  # the commit point
        self._remember(version, state, manifest.manifest_id)
        return CommitResult(
            version,
            len(state),
            snapshot.size + len(body),
            2,
            manifest.path,
            manifest_id=manifest.manifest_id,
            snapshot=True,  # every version is a full state frame
        )

    def _after_retention(self, plan: RetentionPlan) -> None:
        if plan.lowest_retained is None:
            return
        for v in [v for v in self._versions if v not in plan.kept_versions]:  # kept: the last committed too
            del self._versions[v]

    def close(self) -> None:
        self._versions.clear()


def _ref(rel: str, data: pa.Buffer) -> FileRef:
    return FileRef(rel, data.size, checksum(data))
