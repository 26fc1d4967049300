"""A chaos run judged: its final state against the HDFS provider's run (Spark's state data source
at the last batch and two earlier retained ones), its output row for row, and every store of its
checkpoint by the independent referee (tests/referee.py, which shares no code with the product),
after garbage collection past the grace."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import SparkSession

import referee
from backend_support import open_store
from chaoslib.plan import Plan
from spark_support import start_session


@dataclass
class CheckReport:
    stores: int = 0
    manifests: int = 0
    files_checked: int = 0  # files and payloads stored inside manifests, checked by the referee
    gc_deleted: int = 0  # versions garbage collection deleted while the query ran (all stores)
    faults_fired: int = 0  # drawn faults that happened (a seam rule fired, an executor was killed)
    unfired: list[str] = field(default_factory=list)  # drawn faults that never happened
    state_diff: str | None = None  # the first difference of the final state from the HDFS run's
    lost: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)


def committed_batches(checkpoint: Path) -> list[int]:
    """The batches Spark's commit log of `checkpoint` still holds."""
    return sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())


def check_checkpoint(checkpoint: Path, work: Path, retain: int) -> CheckReport:
    """Judged by the referee, which shares no code with the product: every version Spark's commit
    log may still ask for is restorable, every file and payload intact; then, after the product's
    garbage collection past the grace (as the query's own maintenance would run it), nothing is
    left that no retained version needs."""
    report = CheckReport()
    batches = committed_batches(checkpoint)
    newest = batches[-1] + 1
    required = [b + 1 for b in batches if b + 1 >= newest - retain]
    later = time.time() + 24 * 3600
    for store in referee.stores_under(checkpoint / "state"):
        report.stores += 1
        present = {int(p.stem) for p in (store / "manifests").glob("*.json") if p.stem.isdigit()}
        report.gc_deleted += sum(1 for v in range(1, max(present, default=0)) if v not in present)
        backend = open_store(store, work / f"check-{report.stores}", retain)
        try:
            backend.maintenance(now=later)
        finally:
            backend.close()
        verdict = referee.judge_store(
            store, min_batches_to_retain=retain, required=required, now=later + 1, in_flight_seconds=0
        )
        report.manifests += len(verdict.versions)
        report.files_checked += verdict.files_checked + verdict.inline_checked
        report.lost += [f"{store}/{p}" for p in verdict.lost]
        report.orphans += [f"{store}/{p}" for p in verdict.orphans]
    return report


def state_rows(spark: SparkSession, checkpoint: Path, batch: int, options: dict[str, str]) -> list[str]:
    reader = spark.read.format("statestore").option("batchId", batch)
    for k, v in options.items():
        reader = reader.option(k, v)
    df = reader.load(str(checkpoint)).select("key", "value", "partition_id")
    return sorted(repr(r.asDict(recursive=True)) for r in df.collect())


def compare_final_state(plan: Plan, reference: Path, ours: Path) -> str | None:
    """The stateful operator's state in our checkpoint against the HDFS run's, read by Spark's
    state data source in a session of its own (no fault seam), at the last batch and two earlier
    retained ones. Returns the first difference, or None."""
    last = committed_batches(reference)[-1]
    if committed_batches(ours)[-1] != last:
        return f"the last committed batch is {committed_batches(ours)[-1]}, the HDFS run's {last}"
    retain = plan.retain if plan.retain is not None else 100
    # Earlier batches both checkpoints still hold: state and offset log (Spark keeps as many entries).
    batches = [
        b
        for b in (last, last - 1, last - 2)
        if b >= max(0, last - retain) and all((c / "offsets" / str(b)).exists() for c in (reference, ours))
    ]
    sides = [{"joinSide": "left"}, {"joinSide": "right"}] if plan.scenario == "stream_join" else [{}]
    spark = start_session("local[2]", app=f"pystatestore-chaos-state-{plan.seed}")
    try:
        for batch in batches:
            for options in sides:
                want = state_rows(spark, reference, batch, options)
                got = state_rows(spark, ours, batch, options)
                if want != got:
                    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
                    return (
                        f"state at batch {batch} {options or ''}: {len(want)} rows in the HDFS run, {len(got)} in "
                        f"ours; e.g. missing {missing[:1]}, unexpected {extra[:1]}"
                    )
    finally:
        spark.stop()
    return None


def first_difference(expected: dict[int, list[tuple]], actual: dict[int, list[tuple]]) -> str | None:
    for batch in sorted(set(expected) | set(actual)):
        want, got = expected.get(batch), actual.get(batch)
        if want == got:
            continue
        if want is None or got is None:
            return f"batch {batch}: {'missing' if got is None else 'unexpected'} in our run"
        for i, (w, g) in enumerate(zip(want, got, strict=False)):
            if w != g:
                return f"batch {batch}, row {i}: HDFS provider {w}, ours {g}"
        return f"batch {batch}: HDFS provider {len(want)} rows, ours {len(got)}"
    return None
