"""The Spark route of a rewrite: Spark's state reader reads the source stores (so any provider's
files are read by that provider's code), Spark's shuffle places every key, and the shim's
`StateRewrite` writes the target stores through the target provider's own code.

Where the target is one of Spark's providers, `rewrite_in_spark` writes every store of the plan as
the provider's first version, moves it into place as the version after the new batch and reads it
back through the provider. Where the target is pystatestore, `exported_source` only reads: the
shim exports the source state as the bytes our store keeps, and the direct route
(rewrite_direct.py) places and writes it. Both run in `rewrite_session`, a local Spark session
with the shim jar and adaptive execution off; see docs/decisions/0026-state-rewrite.md.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..store import local_disk
from .rewrite_direct import Source, stored_key_encoding
from .rewrite_plan import (
    DATA_POINT,
    HDFS_PROVIDER,
    NAME_POINT,
    ROCKSDB_PROVIDER,
    SCRATCH_DIR,
    Progress,
    RewriteError,
    RewritePlan,
    StoreKind,
    StoreResult,
    provider_name,
    store_dir,
)

ROCKSDB_CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


def rewrite_session(command: str, master: str) -> Any:
    """The local Spark session a rewrite that reads or writes Spark's providers runs in."""
    from pyspark.sql import SparkSession

    from ..spark_minors import configure_spark

    builder = (
        SparkSession.builder.master(master)
        .appName(f"pystatestore {command}")
        .config("spark.sql.adaptive.enabled", "false")  # one task per target partition, in order
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")  # the command draws its own progress bar
    )
    spark = configure_spark(builder).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def rewrite_in_spark(plan: RewritePlan, spark: Any, progress: Progress) -> list[StoreResult]:
    """Every store of `plan` (the target one of Spark's providers) read with Spark's state reader,
    placed by Spark's shuffle and written through the target provider's own code (the shim's
    StateRewrite) as its first version, moved into place, then read back through it."""
    from pyspark.sql import functions as F

    writer = spark._jvm.org.pystatestore.StateRewrite
    scratch = plan.output / SCRATCH_DIR
    results: list[StoreResult] = []
    for i, kind in enumerate(plan.stores):
        progress("rewriting stores", i, len(plan.stores))
        started = time.perf_counter()
        reader = _state_reader(plan, spark, kind)
        key_type = reader.schema["key"].dataType
        fields = [f.name for f in key_type.fields]
        shuffle_cols = [F.col("key").getField(name) for name in fields[: kind.hashed_key_fields(len(fields))]]
        # Every key must sit where Spark's shuffle put it: the check that the columns above are the
        # ones Spark hashes, on this very data, made in the same pass that writes.
        misplaced = F.pmod(F.hash(*shuffle_cols), F.lit(plan.source_partitions)) != F.col("partition_id")
        placed = reader.select("key", "value", misplaced.alias("misplaced")).repartition(
            plan.target_partitions, *shuffle_cols
        )
        schemas = (key_type.json(), reader.schema["value"].dataType.json())
        conf = dict(plan.new_conf)
        if plan.target_provider == ROCKSDB_PROVIDER:
            conf[ROCKSDB_CHANGELOG_CONF] = "false"  # version 1 as a snapshot zip, written at commit
        write_spec = _store_spec(writer, scratch / "state", kind, schemas, conf)
        written, misplaced_rows = _summaries(writer.write(placed._jdf, plan.target_partitions, write_spec))
        if misplaced_rows:
            raise RewriteError(
                f"{misplaced_rows} keys of {kind.label} are not in the partition Spark's hash of "
                f"{len(shuffle_cols)} key columns gives: this operator's keys cannot be placed by a rewrite",
                store=str(plan.source),
                file=f"state/{kind.operator_id}",
                advice="The output is left unfinished; delete it. Report the operator: its keys need another rule.",
            )
        _place_spark_version(plan, kind, scratch / "state")
        read_spec = _store_spec(writer, plan.output / "state", kind, schemas, plan.new_conf)
        read_back, _ = _summaries(
            writer.readBack(spark._jsparkSession, plan.target_partitions, read_spec, plan.state_version)
        )
        if read_back != written:
            bad = sorted(p for p in written if read_back.get(p) != written[p])
            raise RewriteError(
                f"{kind.label}: partitions {bad[:10]} read back other rows than were written "
                f"(written {[written[p] for p in bad[:3]]}, read {[read_back.get(p) for p in bad[:3]]})",
                store=str(plan.output),
                version=plan.state_version,
                advice="The output is left unfinished; delete it and report this with the worker logs.",
            )
        total = sum(rows for rows, _ in written.values())
        results.append(StoreResult(kind, total, plan.target_partitions, time.perf_counter() - started))
    progress("rewriting stores", len(plan.stores), len(plan.stores))
    return results


def exported_source(plan: RewritePlan, spark: Any, progress: Progress, kind: StoreKind, work: Path) -> Source:
    """The state of `kind`'s source stores read by Spark's state reader (so by the source
    provider's own code) and exported by the shim into `work` as the bytes our store keeps."""
    what = f"exporting {kind.label} with Spark's state reader"
    progress(what, 0, 1)

    writer = spark._jvm.org.pystatestore.StateRewrite
    reader = _state_reader(plan, spark, kind)
    schemas = (reader.schema["key"].dataType.json(), reader.schema["value"].dataType.json())
    spec = _store_spec(writer, plan.source / "state", kind, schemas, {})
    encoding = stored_key_encoding(kind, plan.new_conf)
    exported = writer.export(reader._jdf, plan.source_partitions, spec, encoding, str(work))
    rows = {int(doc["partition"]): int(doc["rows"]) for doc in map(json.loads, map(str, exported))}
    progress(what, 1, 1)

    def state(p: int) -> pa.Table:
        path = work / f"source-{p}.arrow"
        expected = rows.get(p)
        table = None
        if path.is_file():
            with pa.OSFile(str(path)) as f:
                table = pa.ipc.open_stream(f).read_all().select(["key", "value"])
            path.unlink()  # its keys are placed next, into a file of their own
        if table is None or table.num_rows != expected:
            raise RewriteError(
                f"{kind.label} partition {p}: the shim's export of Spark's state reader "
                + ("left no file" if table is None else f"holds {table.num_rows} rows")
                + (f", but the reader gave {expected} rows" if expected is not None else " and no summary"),
                store=str(plan.source),
                file=f"state/{kind.operator_id}/{p}",
                advice="The output is left unfinished; delete it and report this with the Spark log.",
            )
        return table

    return Source(state, (str(spec.keySchema().json()), str(spec.valueSchema().json()), encoding))


def _state_reader(plan: RewritePlan, spark: Any, kind: StoreKind) -> Any:
    """Spark's state data source over the last committed batch's state of `kind`'s stores."""
    return (
        spark.read.format("statestore")
        .option("batchId", plan.read_batch)
        .option("operatorId", kind.operator_id)
        .option("storeName", kind.store_name)
        .load(str(plan.source))
    )


def _summaries(lines: Any) -> tuple[dict[int, tuple[int, str]], int]:
    """The shim's per-partition summaries as {partition: (rows, digest)}, and the misplaced rows."""
    out: dict[int, tuple[int, str]] = {}
    misplaced = 0
    for line in lines:
        doc = json.loads(str(line))
        out[int(doc["partition"])] = (int(doc["rows"]), str(doc["digest"]))
        misplaced += int(doc.get("misplaced", 0))
    return out, misplaced


def _store_spec(writer: Any, state_root: Path, kind: StoreKind, schemas: tuple[str, str], conf: dict[str, str]) -> Any:
    """The shim's StoreSpec of `kind` under `state_root`, for a provider running with `conf`."""
    key_json, value_json = schemas
    return writer.storeSpec(
        str(state_root), kind.operator_id, kind.store_name, key_json, value_json, kind.num_cols_prefix_key, conf
    )


def _place_spark_version(plan: RewritePlan, kind: StoreKind, scratch_state: Path) -> None:
    """Spark's providers write a store's whole state only as their first version: the scratch
    store's version 1 becomes version `state_version` of the real store. The HDFS provider's first
    delta holds only puts, as a snapshot does (both are its key-value record stream); the RocksDB
    provider's version 1 is a zip naming SST files by unique names, with no version inside."""
    v = plan.state_version
    disk = local_disk.DISK
    for p in range(plan.target_partitions):
        src, dst = store_dir(scratch_state, kind, p), store_dir(plan.output / "state", kind, p)
        disk.make_dirs(str(dst), NAME_POINT, root=str(plan.output))
        if plan.target_provider == HDFS_PROVIDER:
            moves = {"1.delta": f"{v}.snapshot"}
        else:
            moves = {"1.zip": f"{v}.zip"}
            for sst in sorted((src / "SSTs").glob("*")) if (src / "SSTs").is_dir() else []:
                moves[f"SSTs/{sst.name}"] = f"SSTs/{sst.name}"
        for name, new in moves.items():
            if name.startswith("SSTs/.") or name.endswith(".crc"):
                continue
            if not (src / name).is_file():
                raise RewriteError(
                    f"the {provider_name(plan.target_provider)} provider wrote no {name} for {kind.label} "
                    f"partition {p}",
                    store=str(src),
                    file=name,
                    advice="The output is left unfinished; delete it and report this with the Spark log.",
                )
            # The JVM wrote these without fsync (Hadoop's local filesystem): their data is made
            # durable here, their names with the output's before the checkpoint is finished.
            disk.make_dirs(str((dst / new).parent), NAME_POINT, root=str(plan.output))
            disk.sync_path(str(src / name), DATA_POINT)
            disk.rename(str(src / name), str(dst / new))
            crc = (src / name).with_name(f".{Path(name).name}.crc")
            if crc.is_file():
                disk.sync_path(str(crc), DATA_POINT)
                disk.rename(str(crc), str((dst / new).with_name(f".{Path(new).name}.crc")))
