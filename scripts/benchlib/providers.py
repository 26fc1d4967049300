"""The state store providers the benchmarks compare, and the confs each runs with: one table, so
that every benchmark's "Spark RocksDB, changelog" or "ours, snapshot commits" is the same run. A
benchmark that names its runs otherwise in its output maps its names to these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# pystatestore.PROVIDER_CLASS, named here so that a benchmark's parent process need not import it
OURS = "org.pystatestore.PythonStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"
FORMAT_CONF = "spark.sql.streaming.stateStore.checkpointFormatVersion"
PSS = "spark.sql.streaming.stateStore.pystatestore."


@dataclass(frozen=True)
class Provider:
    cls: str
    confs: Mapping[str, str]
    commits: str  # what a commit writes, so that no figure is read as another mode's

    @property
    def ours(self) -> bool:
        return self.cls == OURS


# Spark's RocksDB provider checkpoints without a changelog by default (4.1-4.3), and pystatestore's
# defaults are the rocksdb backend and changelog commits: a run that names a default names what a
# run that leaves it unset gets.
PROVIDERS: dict[str, Provider] = {
    "hdfs": Provider(HDFS, {}, "Spark HDFS: a delta file per commit, snapshots by maintenance"),
    "rocksdb": Provider(
        ROCKSDB, {CHANGELOG_CONF: "false"}, "Spark RocksDB: a full checkpoint (zip + new SST files) per commit"
    ),
    "rocksdb-changelog": Provider(
        ROCKSDB,
        {CHANGELOG_CONF: "true"},
        "Spark RocksDB, changelogCheckpointing.enabled=true: a changelog file per commit",
    ),
    "pss-changelog": Provider(
        OURS,
        {PSS + "commitMode": "changelog"},
        "pystatestore commitMode=changelog (its default): changes per commit, snapshots when due",
    ),
    "pss-snapshot": Provider(
        OURS,
        {PSS + "commitMode": "snapshot"},
        "pystatestore commitMode=snapshot: an incremental snapshot (new SST files) per commit",
    ),
    "pss-applied-first": Provider(
        OURS,
        {PSS + "commitMode": "changelog", PSS + "durableFirstCommit": "false"},
        "pystatestore changelog, durableFirstCommit=false: the local DB and view before the reply",
    ),
}


def sql_conf(name: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The session confs that run provider `name`: its class and confs, then `extra`."""
    provider = PROVIDERS[name]
    return {PROVIDER_CONF: provider.cls, **provider.confs, **(extra or {})}


def add_ours_from(variant: str) -> str:
    """Adds the run of `--ours-from NAME=DIR` (pystatestore's default commits, its state workers
    importing the package from DIR, another checkout's python/) to PROVIDERS; returns NAME, or
    raises ValueError saying what is wrong with `variant`."""
    name, _, directory = variant.partition("=")
    if not name or not Path(directory, "pystatestore", "__init__.py").is_file():
        raise ValueError(f"--ours-from {variant}: want NAME=DIR, DIR holding a pystatestore package")
    PROVIDERS[name] = Provider(
        OURS,
        {PSS + "commitMode": "changelog", PSS + "pythonPath": str(Path(directory).resolve())},
        f"pystatestore commitMode=changelog, its worker's package from {directory}",
    )
    return name
