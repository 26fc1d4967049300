"""A restore's account, counted by both of its steps: the plan that picks where the state starts
(restore.py) and the replay of the changes after it (replay.py), which restore.py calls. Kept apart
so that replay needs nothing of restore."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...transfer import TransferStats
from ..context import elapsed_ms


@dataclass
class RestoreStats:
    """What a restore did: where the state came from and what it cost."""

    metrics: dict[str, int] = field(default_factory=dict)
    local_files: int = 0
    local_bytes: int = 0
    remote: TransferStats = TransferStats(0, 0)
    replayed: int = 0
    replayed_bytes: int = 0
    inline_snapshots: int = 0  # state read from inside a snapshot manifest: no file of its own
    inline_bytes: int = 0  # segments read from inside manifests (which come from the checkpoint)
    # Where the time went: waiting for files from the checkpoint, ingesting a compact snapshot's
    # state, replaying changes (reading segments, writing and ingesting SSTs), opening restored
    # databases.
    download_ms: int = 0
    ingest_ms: int = 0
    replay_ms: int = 0
    open_ms: int = 0
    started_from: str = "an empty DB"  # for the log: where the state came from before replay

    def downloaded(self, stats: TransferStats) -> None:
        self.remote = TransferStats(self.remote.files + stats.files, self.remote.bytes + stats.bytes)

    def cost(self, started: float) -> dict[str, int]:
        """The restore's metrics, as the service reports them."""
        return {
            "restoreLocalFiles": self.local_files,
            "restoreLocalBytes": self.local_bytes,
            "restoreRemoteFiles": self.remote.files,
            "restoreRemoteBytes": self.remote.bytes,
            "restoreChangelogVersions": self.replayed,
            "restoreChangelogBytes": self.replayed_bytes,
            "restoreInlineSnapshots": self.inline_snapshots,
            "restoreInlineBytes": self.inline_bytes,
            "restoreDownloadMs": self.download_ms,
            "restoreIngestMs": self.ingest_ms,
            "restoreReplayMs": self.replay_ms,
            "restoreOpenMs": self.open_ms,
            "restoreMs": elapsed_ms(started),
        }
