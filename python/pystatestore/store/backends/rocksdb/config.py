"""The rocksdb backend's settings: its confs (read once per store), its tuning constants, and the
RocksDB options every local DB and SST writer of the worker uses."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import rocksdict

from ...errors import StoreConfigError

DEFAULT_TRANSFER_THREADS = 4
DEFAULT_L0_COMPACTION_TRIGGER = 8
# Universal (size-tiered) compaction: a commit's ingested SST is merged with runs of its own size, and
# the big oldest run is rewritten only once the newer runs add up to this share of it. Leveled
# compaction rewrote most of a store every few commits (each L0->L1 compaction overlaps every L1
# file when keys are spread), so each snapshot uploaded the whole store again.
MAX_SIZE_AMPLIFICATION_PERCENT = 50
# Table format the JVM's reader understands: Spark 4.1 ships rocksdbjni 9.8.4, older than the
# RocksDB inside rocksdict (10.x). Format 5 is read by every RocksDB since 6.6.
TABLE_FORMAT_VERSION = 5
BLOOM_BITS_PER_KEY = 10  # point lookups in the JVM skip files that cannot hold the key
METADATA_BLOCK_BYTES = 4096  # index and filter partitions
# RocksDB's MANIFEST grows by every flush and compaction until it reaches this size, then starts
# anew with the current state only: kept small so it can be stored inside our manifests.
MAX_ROCKSDB_MANIFEST_BYTES = 64 << 10
APPLY_CHUNK_ROWS = 16384
# The worker serves no reads (the JVM reads views), so its cache only holds what compactions and
# restores touch: small, shared by every store in the worker.
WORKER_BLOCK_CACHE_BYTES = 2 << 20
COMMIT_MODES = ("changelog", "snapshot")
DEFAULT_COMMIT_MODE = "changelog"
# Files (and changelog segments) up to this size are stored inside the manifest.
DEFAULT_INLINE_BYTES = 16 << 10
# Maintenance snapshots a store whose SSTs add up to at most this much as one segment of its whole
# state (a compact snapshot) rather than as a RocksDB checkpoint.
DEFAULT_COMPACT_SNAPSHOT_BYTES = 1 << 20
# A compact snapshot's segment is stored inside its manifest only up to this size (and the inline
# threshold): base64 adds a third, and a snapshot is made in the background, where the extra file
# costs no commit any latency. At 200 partitions a 500-key snapshot is 6.4 KB as a file, 8.5 KB inline.
COMPACT_SNAPSHOT_INLINE_BYTES = 2 << 10
# Maintenance also makes a snapshot once the changes since the last one add up to this much.
DEFAULT_CHANGELOG_MAX_BYTES = 64 << 20
# A snapshot is also due once replaying the changes since the last one would cost a restore more
# than reading a new snapshot (decision 0041): the worker replays a stored byte of changes about
# 100 times slower than it restores a byte of snapshot (a write per key against a file copy), so
# changes of 1/32 of the snapshot's size already double a restore from it; changes below the floor
# replay in about as long as a snapshot restore's fixed cost (opening the DB, reading manifests).
DEFAULT_SNAPSHOT_CHANGES_FRACTION = 1 / 32
REPLAY_WORTH_A_SNAPSHOT_BYTES = 256 << 10
# Changelog commits keep a local recovery copy every this many versions (staggered across
# partitions so each batch pays for a share of them): a copy costs a commit about as much as its
# own RocksDB work, while a restore replays at most this many minus one versions' changes, which
# the manifests usually hold inline.
DEFAULT_LOCAL_RECOVERY_INTERVAL = 4

_shared_cache_lock = threading.Lock()
_shared_cache: rocksdict.Cache | None = None


@dataclass(frozen=True)
class RocksDBConfig:
    """A store's rocksdb confs (spark.sql.streaming.stateStore.pystatestore.*), checked once."""

    mode: str
    inline_bytes: int
    changelog_max_bytes: int
    compact_snapshot_bytes: int
    threads: int
    l0_trigger: int
    local_copy_interval: int
    snapshot_changes_fraction: float = DEFAULT_SNAPSHOT_CHANGES_FRACTION
    durable_first: bool = True  # commits return once durable, the local DB is brought up after (0032)
    # A version's changes file stays after a snapshot of it exists (decision 0043): the change feed
    # of every retained version, at the cost of storing each snapshotted version twice.
    keep_snapshotted_changes: bool = False

    @classmethod
    def of(cls, options: Mapping[str, str], *, store: str) -> RocksDBConfig:
        mode = options.get("commitMode", DEFAULT_COMMIT_MODE)
        if mode not in COMMIT_MODES:
            raise StoreConfigError(
                f"commitMode={mode!r} is not one of {', '.join(COMMIT_MODES)}",
                store=store,
                advice="Set spark.sql.streaming.stateStore.pystatestore.commitMode to changelog or snapshot.",
            )

        def whole(name: str, default: int, minimum: int) -> int:
            return int_option(options, name, default, minimum=minimum, store=store)

        return cls(
            snapshot_changes_fraction=fraction_option(
                options, "snapshotChangesFraction", DEFAULT_SNAPSHOT_CHANGES_FRACTION, store=store
            ),
            durable_first=bool_option(options, "durableFirstCommit", True, store=store),
            keep_snapshotted_changes=bool_option(options, "keepSnapshottedChanges", False, store=store),
            mode=mode,
            inline_bytes=whole("inlineThresholdBytes", DEFAULT_INLINE_BYTES, 0),
            changelog_max_bytes=whole("changelogMaxBytes", DEFAULT_CHANGELOG_MAX_BYTES, 1),
            compact_snapshot_bytes=whole("compactSnapshotMaxBytes", DEFAULT_COMPACT_SNAPSHOT_BYTES, 0),
            threads=whole("transferThreads", DEFAULT_TRANSFER_THREADS, 1),
            l0_trigger=whole("rocksdb.l0CompactionTrigger", DEFAULT_L0_COMPACTION_TRIGGER, 1),
            local_copy_interval=whole("localRecoveryInterval", DEFAULT_LOCAL_RECOVERY_INTERVAL, 1),
        )


def int_option(options: Mapping[str, str], name: str, default: int, *, minimum: int, store: str) -> int:
    """The whole-number conf `name` (unset: `default`); a clear error when it is not one of at least `minimum`."""
    return _number_option(
        options, name, default, int, lambda v: v >= minimum, f"a whole number of at least {minimum}", store
    )


def bool_option(options: Mapping[str, str], name: str, default: bool, *, store: str) -> bool:
    """The conf `name` as true or false (unset: `default`); a clear error naming it otherwise."""
    raw = options.get(name)
    if raw is None:
        return default
    if raw.strip().lower() not in ("true", "false"):
        raise StoreConfigError(
            f"{name}={raw!r} is not true or false",
            store=store,
            advice=f"Set spark.sql.streaming.stateStore.pystatestore.{name} to true or false "
            f"(unset, it is {str(default).lower()}).",
        )
    return raw.strip().lower() == "true"


def fraction_option(options: Mapping[str, str], name: str, default: float, *, store: str) -> float:
    """The conf `name` as a number from 0 to 1 (unset: `default`; 0 turns its rule off)."""
    return _number_option(options, name, default, float, lambda v: 0.0 <= v <= 1.0, "a number from 0 to 1", store)


N = TypeVar("N", int, float)


def _number_option(
    options: Mapping[str, str],
    name: str,
    default: N,
    parse: Callable[[str], N],
    valid: Callable[[N], bool],
    what: str,
    store: str,
) -> N:
    """The conf `name` parsed (unset: `default`); an error naming the conf unless it parses and is `valid`."""
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = parse(raw)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise StoreConfigError(
            f"{name}={raw!r} is not {what}",
            store=store,
            advice=f"Fix or unset spark.sql.streaming.stateStore.pystatestore.{name}.",
        )
    return value


def block_cache() -> rocksdict.Cache:
    """One block cache for every store in the worker, so memory does not grow with partitions."""
    global _shared_cache
    with _shared_cache_lock:
        if _shared_cache is None:
            _shared_cache = rocksdict.Cache(WORKER_BLOCK_CACHE_BYTES)
        return _shared_cache


@functools.cache  # once per process; a second call would only repeat the same setting
def lower_compaction_priority() -> None:
    """Runs RocksDB's compaction threads (the process-wide LOW pool) at the lowest CPU priority
    (decision 0037). A commit's ingest leaves a compaction due; at normal priority it took a core
    from the next batch's tasks, and after a restart the restored DB redoes the compaction its
    closed predecessor had begun, during the restart batch. At nice 19 it runs mostly on what the
    query leaves idle."""
    rocksdict.Env().lower_thread_pool_cpu_priority()


def db_options(l0_trigger: int, *, create: bool) -> rocksdict.Options:
    """The options of a local DB (and of the SST files ingested into it)."""
    lower_compaction_priority()
    opts = rocksdict.Options(raw_mode=True)
    opts.create_if_missing(create)
    opts.set_compaction_style(rocksdict.DBCompactionStyle.universal())
    universal = rocksdict.UniversalCompactOptions()
    universal.max_size_amplification_percent = MAX_SIZE_AMPLIFICATION_PERCENT
    opts.set_universal_compaction_options(universal)
    opts.set_level_zero_file_num_compaction_trigger(l0_trigger)  # sorted runs before a compaction
    opts.set_level_zero_slowdown_writes_trigger(max(20, l0_trigger * 3))
    opts.set_level_zero_stop_writes_trigger(max(36, l0_trigger * 5))
    opts.set_compression_type(rocksdict.DBCompressionType.lz4())
    opts.set_max_manifest_file_size(MAX_ROCKSDB_MANIFEST_BYTES)
    table = rocksdict.BlockBasedOptions()
    table.set_block_cache(block_cache())
    table.set_format_version(TABLE_FORMAT_VERSION)
    table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
    table.set_cache_index_and_filter_blocks(True)
    # Partitioned index and filters (4 KiB blocks under a small pinned top level): a whole-file
    # filter of a large SST does not fit a block cache shard, and the JVM's bounded cache
    # thrashed on them (every lookup of a new key re-read a file's filter).
    table.set_index_type(rocksdict.BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(METADATA_BLOCK_BYTES)
    table.set_pin_top_level_index_and_filter(True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(16 << 20)
    return opts
