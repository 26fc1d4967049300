"""Errors a user can hit. Each names the store, the version and the file involved, and what to do."""

from __future__ import annotations


class StateStoreError(Exception):
    """Base class: carries the store, version and file so messages stay actionable."""

    advice = "Check the checkpoint location and the worker log."

    def __init__(
        self,
        problem: str,
        *,
        store: str,
        version: int | None = None,
        file: str | None = None,
        advice: str | None = None,
    ) -> None:
        self.problem = problem
        self.store = store
        self.version = version
        self.file = file
        self.advice = advice or self.advice
        parts = [f"pystatestore: {problem}", f"store: {store}"]
        if version is not None:
            parts.append(f"version: {version}")
        if file is not None:
            parts.append(f"file: {file}")
        parts.append(self.advice)
        super().__init__(" | ".join(parts))


class CheckpointDamagedError(StateStoreError):
    """A manifest or data file exists but cannot be trusted (truncated, corrupt, wrong checksum)."""

    advice = (
        "The checkpoint is damaged; nothing was deleted. Restore the file from a backup, or "
        "restart the query from an earlier retained version or a new checkpoint location."
    )


class CheckpointMissingError(StateStoreError):
    """A version or a file a manifest names is not there."""

    advice = (
        "Nothing was deleted. If files were removed by hand, restore them; otherwise restart "
        "the query from a new checkpoint location."
    )


class InvalidPathError(StateStoreError):
    """A path would leave the store directory; refused so nothing outside it is read or deleted."""

    advice = "The manifest was not written by pystatestore or was tampered with; nothing was read or deleted."


class VersionReplacedError(StateStoreError):
    """A version this JVM committed was replaced by another attempt's manifest before it was read."""

    advice = (
        "Another attempt committed this version after this JVM did (Spark ran the batch twice); the task "
        "fails and Spark retries it on the version the checkpoint holds. Nothing was written."
    )


class BaseVersionReplacedError(StateStoreError):
    """A commit was based on an attempt at the base version that another attempt's manifest replaced."""

    advice = (
        "Another attempt committed this version after the one this task started from; the task fails "
        "and Spark retries it on the version the checkpoint holds. Nothing was written."
    )


# What the system (and RocksDB, which words them the same) says of a full disk or a place this user
# cannot write: such a failure is the host's, never a sign of a damaged checkpoint.
DISK_FAILURE_TEXTS = (
    ("full", "No space left on device"),
    ("full", "Disk quota exceeded"),
    ("not writable", "Permission denied"),
    ("not writable", "Operation not permitted"),
    ("not writable", "Read-only file system"),
)


def is_disk_failure(text: str) -> bool:
    return any(words in text for _, words in DISK_FAILURE_TEXTS)


class LocalDiskError(StateStoreError):
    """This host's disk (full, or not writable) failed the store's local working files."""

    advice = (
        "The checkpoint is not affected. Free space on that disk, or set spark.local.dir to a local "
        "directory this user can write, on a disk with room for the state."
    )


class StoreConfigError(StateStoreError):
    """An option the user set cannot be honoured."""

    advice = "Fix the spark.sql.streaming.stateStore.pystatestore.* option named above."
