"""Model-based test of the rocksdb backend and its garbage collection (DESIGN §7).

Random histories of put/remove/commit/abort/reload of an older version/maintenance, with a simulated
worker death between any two steps of a commit or of garbage collection, are run against a dict
model. After every step: every retained version reloads to exactly the model's content, and no file
a retained manifest references is missing; after maintenance past the grace period, no unreferenced
file remains.

The CI run uses the "ci" profile (1,000 examples); `scripts/model_check.sh` runs 10,000.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from backend_support import changes, make_backend, state_of
from pystatestore.backends import StateBackend

settings.register_profile(
    "ci", max_examples=1000, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "thorough", max_examples=10_000, stateful_step_count=20, deadline=None, suppress_health_check=list(HealthCheck)
)
settings.register_profile(
    "quick", max_examples=60, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
)
PROFILE = os.environ.get("PYSTATESTORE_MODEL_PROFILE", "ci")

RETAIN = 2
KEYS = [f"k{i}".encode() for i in range(6)]
COMMIT_POINTS = [
    "commit:applied",
    "commit:flushed",
    "commit:checkpointed",
    "commit:uploaded",
    "commit:manifest-written",
]
FAR_FUTURE = 1e12


class SimulatedCrashError(Exception):
    """The worker died here."""


def crash_at(point: str, after: int = 0):  # noqa: ANN201
    seen = {"n": 0}

    def hook(name: str) -> None:
        if name == point:
            if seen["n"] >= after:
                raise SimulatedCrashError(point)
            seen["n"] += 1

    return hook


class BackendModel(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="pss-model-"))
        self.store_dir = self.root / "store"
        self.generation = 0
        self.backend = self.new_backend()
        self.committed: dict[int, dict[bytes, bytes]] = {0: {}}  # versions that must reload exactly
        self.base = 0
        self.pending: dict[bytes, bytes | None] = {}

    def teardown(self) -> None:
        self.backend.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def new_backend(self) -> StateBackend:
        """A fresh worker: new local directory, nothing in memory."""
        self.generation += 1
        local = self.root / f"local-{self.generation}"
        # Writers share this host's local recovery copies across restarts, as workers on one host do.
        return make_backend(
            "rocksdb",
            self.store_dir,
            local,
            retain=RETAIN,
            grace=60.0,
            options={"localRecoveryDir": str(self.root / "recovery")},
        )

    def cold_reader(self) -> StateBackend:
        """A worker on another host: no local copies, everything comes from the checkpoint."""
        self.generation += 1
        return make_backend(
            "rocksdb",
            self.store_dir,
            self.root / f"local-{self.generation}",
            retain=RETAIN,
            options={"localRecovery": "false"},
        )

    def restart_worker(self) -> None:
        self.backend.close()
        self.backend = self.new_backend()

    def expected_next(self) -> dict[bytes, bytes]:
        state = dict(self.committed[self.base])
        for k, v in self.pending.items():
            if v is None:
                state.pop(k, None)
            else:
                state[k] = v
        return state

    def pending_frame(self):  # noqa: ANN201
        puts = {k: v for k, v in self.pending.items() if v is not None}
        return changes(puts, [k for k, v in self.pending.items() if v is None])

    # -- rules ----------------------------------------------------------------------------
    @rule(key=st.sampled_from(KEYS), value=st.binary(min_size=1, max_size=40))
    def put(self, key: bytes, value: bytes) -> None:
        self.pending[key] = value

    @rule(key=st.sampled_from(KEYS))
    def remove(self, key: bytes) -> None:
        self.pending[key] = None

    @precondition(lambda self: self.base in self.committed)
    @rule()
    def commit(self) -> None:
        expected = self.expected_next()
        self.backend.commit(self.base, self.pending_frame(), f"attempt-{self.generation}")
        self.base += 1
        self.committed[self.base] = expected
        self.pending = {}

    @rule()
    def abort(self) -> None:
        self.pending = {}

    @precondition(lambda self: self.base in self.committed)
    @rule(point=st.sampled_from(COMMIT_POINTS))
    def crash_during_commit(self, point: str) -> None:
        expected = self.expected_next()
        self.backend.fault_hook = crash_at(point)
        try:
            self.backend.commit(self.base, self.pending_frame(), f"attempt-{self.generation}")
            raise AssertionError(f"no crash at {point}")
        except SimulatedCrashError:
            pass
        if point == "commit:manifest-written":  # durable, though the task never heard back
            self.committed[self.base + 1] = expected
        self.restart_worker()  # the task fails; its retry keeps the same base and changes

    @rule(data=st.data())
    def reload_older_version(self, data: st.DataObject) -> None:
        """Spark re-runs an earlier batch: the next commit is based on an older retained version."""
        self.base = data.draw(st.sampled_from(sorted(self.committed)))
        self.pending = {}

    @rule(past_grace=st.booleans())
    def maintenance(self, past_grace: bool) -> None:
        report = self.backend.maintenance(now=FAR_FUTURE if past_grace else None)
        self.forget_below(report["lowestRetained"])
        if past_grace:
            self.assert_no_unreferenced_files()

    @rule(deletions=st.integers(0, 6))
    def crash_during_gc(self, deletions: int) -> None:
        lowest = self.lowest_retained()
        self.backend.fault_hook = crash_at("gc:deleted", after=deletions)
        try:
            self.backend.maintenance(now=FAR_FUTURE)
        except SimulatedCrashError:
            pass
        self.forget_below(lowest)
        self.restart_worker()

    # -- model bookkeeping ----------------------------------------------------------------
    def lowest_retained(self) -> int | None:
        versions = self.manifest_versions()
        return max(versions) - RETAIN if versions else None

    def forget_below(self, lowest: int | None) -> None:
        if lowest is None:
            return
        for v in [v for v in self.committed if v < lowest and v != 0]:
            del self.committed[v]

    def manifest_versions(self) -> list[int]:
        d = self.store_dir / "manifests"
        return [int(p.stem) for p in d.glob("*.json")] if d.exists() else []

    def retained_manifests(self) -> dict[int, dict]:
        lowest = self.lowest_retained()
        return {
            v: json.loads((self.store_dir / "manifests" / f"{v}.json").read_text())
            for v in self.manifest_versions()
            if lowest is not None and v >= lowest
        }

    def data_files(self) -> set[str]:
        return {
            str(p.relative_to(self.store_dir))
            for d in ("shared", "private")
            for p in (self.store_dir / d).rglob("*")
            if p.is_file()
        }

    def assert_no_unreferenced_files(self) -> None:
        referenced = {
            ref["path"]
            for m in self.retained_manifests().values()
            for kind in ("shared", "private")
            for ref in m[kind].values()
        }
        assert self.data_files() == referenced

    # -- invariants -----------------------------------------------------------------------
    @invariant()
    def retained_manifests_reference_only_existing_files(self) -> None:
        if not hasattr(self, "store_dir"):
            return
        files = self.data_files()
        for v, m in self.retained_manifests().items():
            for kind in ("shared", "private"):
                for ref in m[kind].values():
                    assert ref["path"] in files, f"version {v} lost {ref['path']}"

    @invariant()
    def every_retained_version_reloads_exactly(self) -> None:
        if not hasattr(self, "store_dir"):
            return
        lowest = self.lowest_retained()
        reader = self.cold_reader()
        try:
            for v, expected in self.committed.items():
                if v == 0 or lowest is None or v < lowest:
                    continue
                assert state_of(reader, v) == expected, f"version {v}"
        finally:
            reader.close()


BackendModel.TestCase.settings = settings.get_profile(PROFILE)
TestBackendModel = BackendModel.TestCase
