"""Benchmark: restoring state after a restart, pystatestore's local copy vs the checkpoint, and
Spark's RocksDB provider loading the same state, in one run.

Each run builds a state of N keys (one micro-batch), runs one small batch, stops, and restarts the
query from its checkpoint; the restarted query's first batch must restore the state. Every query
runs in a driver JVM of its own, so a restart is a driver restart on the same host: Spark's RocksDB
provider loads from the checkpoint (its working copy died with the JVM's temporary directory),
pystatestore from its local recovery copy (pss-local-copy) or, with localRecovery=false, from the
checkpoint (pss-checkpoint). The restarts go round the runs in rotating order. Reported: that
batch's duration, and for pystatestore the worker's restore time and where the bytes came from.

    .venv/bin/python scripts/bench_restore.py [--keys 1000000] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from benchlib.inputs import stamp_order
from benchlib.providers import PROVIDERS, PSS, sql_conf
from benchlib.query import PARTITIONS, run_query_in_own_jvm
from benchlib.repeats import medians_over, rotation
from benchlib.report import code_version, provenance, watching_load, write_report

RESTARTS = 3
# run -> (provider, what it sets besides): our restores from the local copy and from the checkpoint
RUNS = {
    "spark-rocksdb": ("rocksdb", {}),
    "pss-local-copy": ("pss-changelog", {PSS + "localRecovery": "true"}),
    "pss-checkpoint": ("pss-changelog", {PSS + "localRecovery": "false"}),
}


def write_file(input_dir: Path, index: int, keys: range) -> None:
    path = input_dir / f"f{index:03d}.parquet"
    pq.write_table(
        pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array([index] * len(keys), pa.int64())}), path
    )
    stamp_order(path, index)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keys", type=int, default=1_000_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    code = code_version()
    work = Path(tempfile.mkdtemp(prefix="pss-bench-restore-"))
    session = {"spark.driver.memory": "6g"}
    names = list(RUNS)

    def conf(name: str) -> dict[str, str]:
        provider, confs = RUNS[name]
        local = {PSS + "localRecoveryDir": str(work / f"recovery-{name}")} if PROVIDERS[provider].ours else {}
        return sql_conf(provider, {**confs, **local})

    with watching_load() as load:
        for name in names:
            load.phase = f"{name} build"
            input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
            input_dir.mkdir()
            write_file(input_dir, 0, range(args.keys))
            write_file(input_dir, 1, range(0, args.keys, 1000))
            _, version = run_query_in_own_jvm(
                work, f"{name}-build", conf(name), input_dir, checkpoint, session_conf=session
            )
        samples: dict[str, list[dict[str, float]]] = {name: [] for name in names}
        for restart in range(RESTARTS):  # each restart adds a small file and restores the state
            for name in rotation(names, restart):
                load.phase = name
                input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
                write_file(input_dir, 2 + restart, range(1 + restart, args.keys, 1000))
                first = run_query_in_own_jvm(
                    work, f"{name}-restart{restart}", conf(name), input_dir, checkpoint, session_conf=session
                )[0][0]
                op = first["stateOperators"][0]
                m = op.get("customMetrics", {})
                samples[name].append(
                    {
                        "batch_ms": first["durationMs"]["triggerExecution"],
                        "rows": op["numRowsTotal"],
                        "restore_ms": m.get("pystatestoreRestoreMs", 0) / PARTITIONS,
                        "load_ms": m.get("pystatestoreLoadMs", 0) / PARTITIONS,
                        "local_mb": m.get("pystatestoreRestoreLocalBytes", 0) / 2**20,
                        # files and the changes stored inside manifests: both come from the checkpoint
                        "remote_mb": (
                            m.get("pystatestoreRestoreRemoteBytes", 0) + m.get("pystatestoreRestoreInlineBytes", 0)
                        )
                        / 2**20,
                    }
                )
    results = {name: medians_over(runs) for name, runs in samples.items()}
    shutil.rmtree(work, ignore_errors=True)

    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore restore bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: .venv/bin/python scripts/bench_restore.py --keys {args.keys}",
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {version}, local[2], {PARTITIONS} partitions",
        load_line,
        f"# workload: {args.keys} keys of aggregation state, query restarted {RESTARTS} times, each restart a "
        "new driver JVM on the same host, the runs in rotating order; medians of the first batch after each restart",
        "",
        f"{'run':<16}{'restart batch ms':>17}{'worker restore ms/part':>24}{'JVM load ms/part':>18}"
        f"{'from local copy':>17}{'from checkpoint':>17}",
    ]
    for name, r in results.items():
        if PROVIDERS[RUNS[name][0]].ours:
            own = f"{r['restore_ms']:>24.0f}{r['load_ms']:>18.0f}{r['local_mb']:>13.1f} MiB{r['remote_mb']:>13.1f} MiB"
        else:  # Spark's RocksDB provider reports no such metrics; a new JVM has nothing local
            own = f"{'-':>24}{'-':>18}{'-':>17}{'all of it':>17}"
        lines.append(f"{name:<16}{r['batch_ms']:>17.0f}{own}")
    local, remote, spark_r = results["pss-local-copy"], results["pss-checkpoint"], results["spark-rocksdb"]
    lines += [
        "",
        f"worker restore, local copy / checkpoint: {local['restore_ms'] / max(remote['restore_ms'], 1):.2f}x",
        f"restart batch, local copy / checkpoint: {local['batch_ms'] / remote['batch_ms']:.2f}x",
        f"restart batch, pss local copy / Spark RocksDB: {local['batch_ms'] / spark_r['batch_ms']:.2f}x",
        f"restart batch, pss checkpoint / Spark RocksDB: {remote['batch_ms'] / spark_r['batch_ms']:.2f}x",
    ]
    write_report("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    sys.exit(main())
