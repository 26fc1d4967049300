"""Benchmark: a restart on a new host (issue 67). A streaming count per key builds its state, then is
restarted in a new driver JVM whose spark.local.dir and pystatestore localRecoveryDir are empty, so
every provider restores from the checkpoint alone; the restart's first batch (1,000 keys spread over
the state) is timed. Beside it: pystatestore restarted on the same host (its local recovery copies
kept), and the floor of reading the bytes our restore reads once from the checkpoint (`cat` of the
files, cold and warm page cache), and each provider's first batch of a new query with no state yet
(same input, new driver JVM): a restart batch less that is what restoring state costs it.

Workloads (issue 67's): (a) 8M keys written in 4 batches, 4 partitions; (b) 32M keys in 8 batches,
a 1 GiB heap; (c) 100k keys, then 59 batches each updating 1% of them, 200 partitions. Spark's
RocksDB provider runs in its default mode and in changelog mode. Each build lingers so that
maintenance makes what is due, as it would in a running query; the restarts go round the runs in
rotating order, medians over --repeat restarts.

    .venv/bin/python scripts/bench_new_host.py --workload a [--repeat 3] [--pyspark 4.3]
        [--ours-from NAME=DIR] [--scale 1.0] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchlib.build import reexec_under_pyspark
from benchlib.child import run_child, with_scripts_path
from benchlib.inputs import stamp_order
from benchlib.providers import PROVIDERS, PSS, add_ours_from, sql_conf
from benchlib.query import run_query_in_own_jvm
from benchlib.repeats import medians_over, range_text, rotation
from benchlib.report import code_version, provenance, watching_load, write_report

LINGER_S = 20.0  # after the build: maintenance runs every 2 s (benchlib.query)
RESTART_KEYS = 1_000


@dataclass(frozen=True)
class Workload:
    describe: str
    partitions: int
    driver_memory: str
    batches: list[tuple[int, int]]  # per input file: (first key, keys) of new keys, or (-1, n): n random updates
    total_keys: int


EMPTY_STATE = {"rocksdb": "spark-rocksdb-empty-state", "pss-changelog": "pss-empty-state"}


def workload_of(name: str, scale: float) -> Workload:
    def n(keys: int) -> int:
        return max(1000, int(keys * scale))

    if name == "a":
        per = n(2_000_000)
        return Workload(f"{4 * per:,} keys written in 4 batches", 4, "2g", [(i * per, per) for i in range(4)], 4 * per)
    if name == "b":
        per = n(4_000_000)
        return Workload(
            f"{8 * per:,} keys written in 8 batches, a 1 GiB heap", 4, "1g", [(i * per, per) for i in range(8)], 8 * per
        )
    keys = n(100_000)
    return Workload(
        f"{keys:,} keys, then 59 batches each updating 1% of them",
        200,
        "2g",
        [(0, keys)] + [(-1, keys // 100)] * 59,
        keys,
    )


def write_inputs(build_dir: Path, w: Workload) -> list[Path]:
    build_dir.mkdir()
    rnd = random.Random(67)
    files = []
    for i, (first, count) in enumerate(w.batches):
        keys = rnd.sample(range(w.total_keys), count) if first < 0 else range(first, first + count)
        path = build_dir / f"batch-{i:04d}.parquet"
        pq.write_table(pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array([i] * count, pa.int64())}), path)
        stamp_order(path, i)
        files.append(path)
    return files


def write_restart_input(input_dir: Path, w: Workload, restart: int) -> None:
    step = max(1, w.total_keys // RESTART_KEYS)
    keys = range(restart, w.total_keys, step)
    path = input_dir / f"restart-{restart:02d}.parquet"
    pq.write_table(pa.table({"key": pa.array(keys, pa.int64()), "value": pa.array([-1] * len(keys), pa.int64())}), path)
    stamp_order(path, len(w.batches) + restart)


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def files_a_restore_reads(state_dir: Path) -> list[Path]:
    """For each store of the checkpoint (pystatestore's layout, checkpoint format 1), the newest
    version's manifest and, walking its chain back to a snapshot, every manifest and file a new-host
    restore reads: the snapshot's files, then each later version's changes file."""
    out: list[Path] = []
    for manifests in sorted(state_dir.glob("*/*/manifests")):
        store = manifests.parent
        versions = sorted(int(p.stem) for p in manifests.glob("*.json") if p.stem.isdigit())
        if not versions:
            continue
        version = versions[-1]
        while version > 0:
            path = manifests / f"{version}.json"
            doc = json.loads(path.read_bytes())
            out.append(path)
            if doc.get("kind") == "changelog":
                snapshots = list((store / "snapshots").glob(f"{version}-{doc['manifest_id']}.json"))
                if snapshots:
                    out.append(snapshots[0])
                    out += _named_files(store, json.loads(snapshots[0].read_bytes()))
                    break
                out += [store / doc["changes"]["path"]] if "path" in doc.get("changes", {}) else []
                version = doc["base_version"]
            else:
                out += _named_files(store, doc)
                break
    return out


def _named_files(store: Path, doc: dict[str, Any]) -> list[Path]:
    refs = [*doc.get("shared", {}).values(), *doc.get("private", {}).values(), doc.get("changes") or {}]
    return [store / r["path"] for r in refs if "path" in r]


def restore_alone(state_dir: Path, repeat: int) -> dict[str, float]:
    """Medians over `repeat` of every store restored in turn with nothing else running, the
    checkpoint dropped from the page cache first (benchlib.restore_alone): comparable with the floor."""
    runs = []
    for _ in range(repeat):
        evict_from_page_cache([p for p in state_dir.rglob("*") if p.is_file()])
        child = run_child(["-m", "benchlib.restore_alone", str(state_dir)], env=with_scripts_path(), timeout=600)
        if child.returncode != 0:
            raise RuntimeError(f"restoring {state_dir} alone failed: {child.stderr[-2000:]}")
        runs.append(json.loads(child.stdout.strip().splitlines()[-1]))
    return medians_over(runs)


def evict_from_page_cache(files: list[Path]) -> None:
    """Drops `files` from the page cache (written back first), as a new host would find them."""
    os.sync()
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_once_ms(files: list[Path], *, cold: bool) -> float:
    """The time to read `files` once, one after another (`cat`); cold: each evicted from the page cache first."""
    if cold:
        evict_from_page_cache(files)
    started = time.perf_counter()
    buffer = bytearray(1 << 20)
    for f in files:
        with open(f, "rb", buffering=0) as src:
            while src.readinto(buffer):
                pass
    return (time.perf_counter() - started) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["a", "b", "c"], required=True)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pyspark", default=None, help="run under this Spark minor's pyspark (4.1, 4.2, 4.3)")
    ap.add_argument(
        "--ours-from", action="append", default=[], metavar="NAME=DIR", help="another pystatestore, new host"
    )
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every key count (a quick look: 0.05)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    # run -> (provider, new host?)
    runs: dict[str, tuple[str, bool]] = {
        "spark-rocksdb": ("rocksdb", True),
        "spark-rocksdb-changelog": ("rocksdb-changelog", True),
        "pss-new-host": ("pss-changelog", True),
        "pss-same-host": ("pss-changelog", False),
        # The same first batch of a query with no state yet, in a new driver JVM: what a restart batch
        # costs besides restoring state (JVM warm-up, planning, the job), for each provider.
        EMPTY_STATE["rocksdb"]: ("rocksdb", True),
        EMPTY_STATE["pss-changelog"]: ("pss-changelog", True),
    }
    for variant in args.ours_from:
        try:
            runs[add_ours_from(variant)] = (variant.partition("=")[0], True)
        except ValueError as e:
            ap.error(str(e))
    reexec_under_pyspark(args.pyspark)
    code = code_version()
    w = workload_of(args.workload, args.scale)
    work = Path(tempfile.mkdtemp(prefix="pss-bench-new-host-"))
    build_files = write_inputs(work / "build-input", w)
    names = list(runs)

    def jvm_conf(name: str, tag: str) -> tuple[dict[str, str], dict[str, str]]:
        """(sql confs, session confs) of one JVM of run `name`: a new host gets empty local dirs."""
        provider, new_host = runs[name]
        local = work / (f"local-{name}-{tag}" if new_host else f"local-{name}")
        local.mkdir(exist_ok=True)
        extra = {PSS + "localRecoveryDir": str(local / "recovery")} if PROVIDERS[provider].ours else {}
        session = {"spark.driver.memory": w.driver_memory, "spark.local.dir": str(local / "spark")}
        return sql_conf(provider, extra), session

    checkpoint_mib: dict[str, float] = {}
    floors: dict[str, tuple[float, float, float]] = {}
    alone: dict[str, dict[str, float]] = {}
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    with watching_load() as load:
        for name in names:
            if name in EMPTY_STATE.values():
                checkpoint_mib[name] = 0.0
                continue
            load.phase = f"{name} build"
            print(f"bench_new_host: building {name}", flush=True)
            input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
            input_dir.mkdir()
            for f in build_files:
                os.link(f, input_dir / f.name)  # the same file, modification time included
            sql, session = jvm_conf(name, "build")
            _, spark_version = run_query_in_own_jvm(
                work,
                f"{name}-build",
                sql,
                input_dir,
                checkpoint,
                partitions=w.partitions,
                linger_s=LINGER_S,
                session_conf=session,
            )
            checkpoint_mib[name] = tree_bytes(checkpoint / "state") / 2**20
            if PROVIDERS[runs[name][0]].ours and runs[name][1]:
                files = files_a_restore_reads(checkpoint / "state")
                floors[name] = (
                    sum(f.stat().st_size for f in files) / 2**20,
                    read_once_ms(files, cold=True),
                    read_once_ms(files, cold=False),
                )
                if name == "pss-new-host":  # the installed package: --ours-from runs are other code
                    alone[name] = restore_alone(checkpoint / "state", args.repeat)
        for restart in range(args.repeat):
            for name in rotation(names, restart):
                load.phase = name
                print(f"bench_new_host: restart {restart + 1}/{args.repeat}: {name}", flush=True)
                input_dir, checkpoint = work / f"in-{name}", work / f"ckpt-{name}"
                if name in EMPTY_STATE.values():  # a new query each time
                    input_dir, checkpoint = work / f"in-{name}-{restart}", work / f"ckpt-{name}-{restart}"
                    input_dir.mkdir()
                write_restart_input(input_dir, w, restart)
                sql, session = jvm_conf(name, f"restart{restart}")
                # A new host finds none of the checkpoint in its page cache (a same-host restart
                # does not read it); the build and earlier restarts left it there.
                evict_from_page_cache([p for p in checkpoint.rglob("*") if p.is_file()])
                first = run_query_in_own_jvm(
                    work,
                    f"{name}-restart{restart}",
                    sql,
                    input_dir,
                    checkpoint,
                    partitions=w.partitions,
                    session_conf=session,
                )[0][0]
                m = first["stateOperators"][0].get("customMetrics", {})
                samples[name].append(
                    {
                        "batch_ms": first["durationMs"]["triggerExecution"],
                        "restore_ms": m.get("pystatestoreRestoreMs", 0),
                        "download_ms": m.get("pystatestoreRestoreDownloadMs", 0),
                        "add_batch_ms": first["durationMs"].get("addBatch", 0),
                        "load_ms": m.get("pystatestoreLoadMs", 0),
                        "worker_start_ms": m.get("pystatestoreWorkerStartMs", 0),
                        "ingest_ms": m.get("pystatestoreRestoreIngestMs", 0),
                        "replay_ms": m.get("pystatestoreRestoreReplayMs", 0),
                        "open_ms": m.get("pystatestoreRestoreOpenMs", 0),
                        "replayed": m.get("pystatestoreRestoreChangelogVersions", 0),
                        "local_mib": m.get("pystatestoreRestoreLocalBytes", 0) / 2**20,
                        "remote_mib": (
                            m.get("pystatestoreRestoreRemoteBytes", 0) + m.get("pystatestoreRestoreInlineBytes", 0)
                        )
                        / 2**20,
                    }
                )
    shutil.rmtree(work, ignore_errors=True)
    results = {name: medians_over(s) for name, s in samples.items()}
    print(report(args, code, load, spark_version, w, runs, results, checkpoint_mib, floors, alone))


def report(
    args: argparse.Namespace,
    code: str,
    load: Any,
    spark_version: str,
    w: Workload,
    runs: dict[str, tuple[str, bool]],
    results: dict[str, dict[str, Any]],
    checkpoint_mib: dict[str, float],
    floors: dict[str, tuple[float, float, float]],
    alone: dict[str, dict[str, float]],
) -> str:
    command = f".venv/bin/python scripts/bench_new_host.py --workload {args.workload} --repeat {args.repeat}"
    command += f" --pyspark {args.pyspark}" if args.pyspark else ""
    command += "".join(f" --ours-from {v}" for v in args.ours_from) + (
        f" --scale {args.scale}" if args.scale != 1 else ""
    )
    code_line, load_line = provenance(code, load)
    lines = [
        f"# pystatestore new-host restart bench, {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"# command: {command}",
        code_line,
        f"# machine: {platform.machine()}, {os.cpu_count()} cores, Spark {spark_version}, local[2], {w.partitions} "
        f"partitions, spark.driver.memory={w.driver_memory}",
        load_line,
        f"# workload ({args.workload}): a count per key, {w.describe}; built in one driver JVM that then lingers "
        f"{LINGER_S:.0f} s, then restarted {args.repeat} times, each a new driver JVM (new host: empty spark.local.dir "
        f"and localRecoveryDir) running one batch of {RESTART_KEYS:,} keys; the runs in rotating order, medians "
        "(ranges); restore times are pystatestore's, summed over partitions",
        "",
        f"{'run':<26}{'restart batch ms':>17}{'range':>14}{'restore ms':>11}{'download':>9}{'ingest':>7}{'replay':>8}"
        f"{'open':>6}{'replayed':>9}{'local MiB':>10}{'checkpoint read MiB':>20}{'checkpoint MiB':>15}",
    ]
    for name, r in results.items():
        ours = PROVIDERS[runs[name][0]].ours
        own = (
            f"{r['restore_ms']:>11.0f}{r['download_ms']:>9.0f}{r['ingest_ms']:>7.0f}{r['replay_ms']:>8.0f}{r['open_ms']:>6.0f}"
            f"{r['replayed']:>9.0f}{r['local_mib']:>10.1f}{r['remote_mib']:>20.1f}"
            if ours
            else f"{'-':>11}{'-':>9}{'-':>7}{'-':>8}{'-':>6}{'-':>9}{'-':>10}{'all of it':>20}"
        )
        lines.append(
            f"{name:<26}{r['batch_ms']:>17.0f}{range_text(r, 'batch_ms', '.0f'):>14}{own}{checkpoint_mib[name]:>15.1f}"
        )
    lines.append("")
    for name, r in results.items():
        ours = PROVIDERS[runs[name][0]].ours
        lines.append(
            f"{name}: of the restart batch, addBatch {r['add_batch_ms']:.0f} ms"
            + (
                f"; the JVM's loads {r['load_ms']:.0f} ms and waiting for a state worker to start "
                f"{r['worker_start_ms']:.0f} ms, summed over partitions"
                if ours
                else ""
            )
        )
    for name, (mib, cold, warm) in floors.items():
        restore = results[name]["restore_ms"]
        lines.append(
            f"floor for {name}: reading the {mib:.1f} MiB its first restart reads once takes {cold:.0f} ms cold, "
            f"{warm:.0f} ms warm; its restore (summed over partitions) / cold floor: {restore / max(cold, 1):.2f}x"
        )
        if name in alone:
            a = alone[name]
            lines.append(
                f"  restored alone (each store in turn, no Spark, cold page cache; medians of {args.repeat}): "
                f"{a['restoreMs']:.0f} ms summed (download {a['restoreDownloadMs']:.0f}, ingest "
                f"{a['restoreIngestMs']:.0f}, replay "
                f"{a['restoreReplayMs']:.0f}, open {a['restoreOpenMs']:.0f}); / cold floor: "
                f"{a['restoreMs'] / max(cold, 1):.2f}x"
            )
    spark, spark_cl = results["spark-rocksdb"]["batch_ms"], results["spark-rocksdb-changelog"]["batch_ms"]
    same = results["pss-same-host"]["batch_ms"]
    for name, (_, new_host) in runs.items():
        if PROVIDERS[runs[name][0]].ours and new_host and name not in EMPTY_STATE.values():
            b = results[name]["batch_ms"]
            lines.append(
                f"restart batch, {name} / Spark RocksDB: {b / spark:.2f}x; / Spark RocksDB changelog: "
                f"{b / spark_cl:.2f}x; / pss-same-host: {b / same:.2f}x"
            )
    # What state costs a restart batch: the batch less the same provider's empty-state first batch.
    state_ms = {
        name: results[name]["batch_ms"] - results[EMPTY_STATE[runs[name][0]]]["batch_ms"]
        for name in ("spark-rocksdb", "pss-new-host", "pss-same-host")
    }
    # Below the spread of the empty-state batches themselves, a difference is noise, not a cost.
    noise = max(hi - lo for lo, hi in (results[n]["batch_ms_range"] for n in EMPTY_STATE.values()))
    ours, spark_state = state_ms["pss-new-host"], state_ms["spark-rocksdb"]
    lines.append(
        "restart batch less the empty-state first batch (what restoring state costs the batch): "
        + ", ".join(f"{name} {ms:.0f} ms" for name, ms in state_ms.items())
        + f"; the empty-state batches spread over {noise:.0f} ms; pss-new-host / Spark RocksDB: "
        + (f"{ours / spark_state:.2f}x" if ours > noise and spark_state > noise else "not above that spread")
    )
    ratio = checkpoint_mib["pss-new-host"] / checkpoint_mib["spark-rocksdb"]
    lines.append(f"checkpoint bytes, pss-new-host / Spark RocksDB: {ratio:.2f}x")
    text = "\n".join(lines) + "\n"
    write_report(text, args.out)
    return ""


if __name__ == "__main__":
    sys.exit(main())
