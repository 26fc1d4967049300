"""transformWithState on Spark 4.1 through pystatestore (issue 33): its column families (value,
list and map state, event-time timers, TTL, initial state, a deleted state variable) against
Spark's RocksDB provider, batch for batch across restarts, and the state data source's
per-variable reads and change feed. Spark 4.2+ refuse every
provider but their RocksDB one for transformWithState (tests/test_spark_limits.py)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pyspark
import pytest
from pyspark import cloudpickle
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor, StatefulProcessorHandle

from pystatestore.store.errors import StateStoreError
from spark_support import start_session

# The processor is unpickled in Python workers whose path does not hold tests/: send it by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(
        tuple(int(p) for p in pyspark.__version__.split(".")[:2]) != (4, 1),
        reason="Spark 4.2+ refuse transformWithState on any provider but their RocksDB one",
    ),
]

PROVIDER_CONF = "spark.sql.streaming.stateStore.providerClass"
ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
OUTPUT = "key string, kind string, n long, detail string"
# Four runs, a restart before each: every timer, TTL expiry and deleted variable a run sets up is
# met by a later run (six took 64 s a test on 4.1; the test command's longest module).
BATCHES = 4


class Tally(StatefulProcessor):
    """Per key: a count (ValueState), every value seen (ListState), a count per value (MapState),
    and an event-time timer 5 s after the newest event that reports and clears all three."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.seen = handle.getListState("seen", "v long")
        self.per_value = handle.getMapState("perValue", "v long", "c long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        newest = 0
        for frame in rows:
            for v, ts in zip(frame["v"], frame["ts"], strict=True):
                n += 1
                self.seen.appendValue((int(v),))
                c = self.per_value.getValue((int(v),))[0] if self.per_value.containsKey((int(v),)) else 0
                self.per_value.updateValue((int(v),), (c + 1,))
                newest = max(newest, int(ts.timestamp() * 1000))
        self.count.update((n,))
        self.handle.registerTimer(newest + 5000)
        seen = sorted(x[0] for x in self.seen.get())
        per_value = sorted((k[0], v[0]) for k, v in self.per_value.iterator())
        yield pd.DataFrame({"key": [key[0]], "kind": ["input"], "n": [n], "detail": [json.dumps([seen, per_value])]})

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        n = self.count.get()[0] if self.count.exists() else -1
        self.count.clear()
        self.seen.clear()
        self.per_value.clear()
        expiry = str(expiredTimerInfo.getExpiryTimeInMs())
        yield pd.DataFrame({"key": [key[0]], "kind": ["expired"], "n": [n], "detail": [expiry]})

    def close(self) -> None:
        pass


def run_batches(
    spark: SparkSession, root: Path, rows_total: list[tuple[int, int]] | None = None
) -> list[tuple[int, list[tuple]]]:
    """BATCHES query runs (a restart before each), one input file each; every micro-batch's rows.
    Each batch's numRowsTotal (Spark's numKeys of the state) goes to `rows_total`."""
    source, checkpoint = root / "in", root / "checkpoint"
    source.mkdir(parents=True)
    out: list[tuple[int, list[tuple]]] = []
    for b in range(BATCHES):
        rows = [
            {"k": f"k{(b * 7 + i) % 11}", "v": (b * 13 + i * 5) % 9, "ts": f"2026-01-01 00:00:{b * 3 + i % 4:02d}"}
            for i in range(20)
        ]
        (source / f"{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
        events = spark.readStream.schema("k string, v long, ts timestamp").json(str(source))
        query = (
            events.withWatermark("ts", "2 seconds")
            .groupBy("k")
            .transformWithStateInPandas(Tally(), outputStructType=OUTPUT, outputMode="Update", timeMode="EventTime")
            .writeStream.foreachBatch(lambda df, batch: out.append((batch, sorted(map(tuple, df.collect())))))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(300)
        assert query.exception() is None, query.exception()
        if rows_total is not None:
            rows_total += [(p["batchId"], p["stateOperators"][0]["numRowsTotal"]) for p in query.recentProgress]
    return out


def state_reads(spark: SparkSession, checkpoint: Path) -> dict[str, list[tuple]]:
    """What the state data source reads per state variable, and the count's change feed."""
    reads: dict[str, list[tuple]] = {}
    for name in ("count", "seen", "perValue"):
        frame = spark.read.format("statestore").option("path", str(checkpoint)).option("stateVarName", name).load()
        reads[name] = sorted(map(tuple, frame.drop("partition_id").collect()))
    feed = (
        spark.read.format("statestore")
        .option("path", str(checkpoint))
        .option("stateVarName", "count")
        .option("readChangeFeed", True)
        .option("changeStartBatchId", 0)
        .load()
    )
    # In the reader's order: per partition (so per key) the order the changes were made in.
    reads["count changes"] = [tuple(r) for r in feed.drop("partition_id").collect()]
    # Spark's RocksDB snapshots the version that created the families: the reader can start there.
    reads["count at batch 0 from its snapshot"] = sorted(
        tuple(row)
        for partition in range(3)  # the session's shuffle partitions
        for row in spark.read.format("statestore")
        .option("path", str(checkpoint))
        .option("stateVarName", "count")
        .option("snapshotStartBatchId", 0)
        .option("snapshotPartitionId", partition)
        .option("batchId", 0)
        .load()
        .drop("partition_id")
        .collect()
    )
    return reads


@contextlib.contextmanager
def session_on(provider: str | None) -> Iterator[SparkSession]:
    """A local session whose queries use `provider` (None: pystatestore, as configure_spark sets)."""
    previous = os.environ.get("PYSPARK_PYTHON")
    # The processor's init runs on the driver in PYSPARK_PYTHON's Python: this one has pandas.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = start_session(
        "local[2]", **{"spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true"}
    )
    try:
        if provider is not None:
            spark.conf.set(PROVIDER_CONF, provider)
        assert spark.conf.get(PROVIDER_CONF) == (provider or "org.pystatestore.PythonStateStoreProvider")
        yield spark
    finally:
        spark.stop()
        if previous is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = previous


ROWS_TOTAL = "numRowsTotal per batch"


def run_on(provider: str | None, root: Path) -> tuple[list, dict]:
    rows_total: list[tuple[int, int]] = []
    with session_on(provider) as spark:
        batches = run_batches(spark, root, rows_total)
        return batches, {**state_reads(spark, root / "checkpoint"), ROWS_TOTAL: rows_total}


@pytest.fixture(scope="module")
def both_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[tuple[list, dict], tuple[list, dict], Path]:
    root = tmp_path_factory.mktemp("tws")
    reference = run_on(ROCKSDB, root / "rocksdb")
    ours = run_on(None, root / "ours")
    return reference, ours, root / "ours" / "checkpoint"


def test_every_micro_batch_equals_sparks_rocksdb_provider(both_runs) -> None:  # noqa: ANN001
    (reference, _), (ours, _), checkpoint = both_runs
    assert (checkpoint / "state" / "0" / "0" / "manifests").is_dir(), "the query did not run on pystatestore"
    kinds = {row[1] for _, rows in reference for row in rows}
    assert kinds == {"input", "expired"}, f"the workload must fire timers too: {kinds}"
    assert len(ours) == len(reference) >= BATCHES
    for (batch, want), (got_batch, got) in zip(reference, ours, strict=True):
        assert got_batch == batch and got == want, f"batch {batch}"


def test_the_state_reader_reads_each_variable_and_its_change_feed_as_on_rocksdb(both_runs) -> None:  # noqa: ANN001
    (_, reference), (_, ours), _ = both_runs
    assert all(reference[name] for name in reference), {k: len(v) for k, v in reference.items()}
    for name, rows in reference.items():
        if name == ROWS_TOTAL:
            continue
        if name == "count changes":
            # Spark's RocksDB logs every call (two timers of a key firing in one batch delete it
            # twice); ours keeps each version's net change. Compared as net changes per batch.
            rows, got = net_changes(rows), net_changes(ours[name])
            assert sorted(ours[name]) == got, "our feed holds one net change per key and batch"
        else:
            got = ours[name]
        assert got == rows, f"{name}: {got[:5]} vs {rows[:5]}"


def test_num_rows_total_counts_state_variables_as_on_rocksdb(both_runs) -> None:  # noqa: ANN001
    """Spark's numRowsTotal counts the keys of state variables (a list is one), not timers or our
    family registry: it equals Spark's RocksDB provider's batch for batch, restarts included."""
    (_, reference), (_, ours), _ = both_runs
    assert len(reference[ROWS_TOTAL]) >= BATCHES and max(n for _, n in reference[ROWS_TOTAL]) > 0
    assert ours[ROWS_TOTAL] == reference[ROWS_TOTAL]


def test_pystatestore_read_reads_each_variable_as_the_state_reader_does(both_runs) -> None:  # noqa: ANN001
    """`pystatestore read --family NAME` decodes a variable's column family without Spark: its rows
    equal what Spark's state reader shows of it (a list's values one row each; a map's composite key
    of grouping key and user key shown as the reader shows it, two columns)."""
    from pystatestore.reading.checkpoint import open_checkpoint
    from pystatestore.reading.decoded import python_rows
    from pystatestore.tools.state_rows import read_state
    from test_cli import normal

    (_, _), (_, spark_reads), checkpoint = both_runs
    ckpt = open_checkpoint(str(checkpoint))
    for name in ("count", "seen", "perValue"):
        theirs = sorted((tuple(normal(x) for x in row) for row in spark_reads[name]), key=repr)
        ours = []
        for row in python_rows(read_state(ckpt, family=name)):
            key = row["key"]
            if set(key) == {"key", "userKey"}:  # a map's composite key
                ours.append((key["key"], key["userKey"], row["value"]))
            else:
                ours.append((key, row["value"]))
        assert theirs, name
        assert sorted(ours, key=repr) == theirs, f"{name}: {sorted(ours, key=repr)[:3]} vs {theirs[:3]}"
    with pytest.raises(StateStoreError, match="families: .*count") as e:
        read_state(ckpt)
    assert "--family" in str(e.value)


def test_inspect_and_report_count_each_variable_as_the_state_reader_reads_it(both_runs, tmp_path: Path) -> None:  # noqa: ANN001
    """`pystatestore inspect --families` gives each state variable's values, summed over partitions,
    as many as Spark's state reader reads of it (a list: one row per value); the HTML report has the
    same table; without --families, inspect says the stores have families."""
    from click.testing import CliRunner

    from pystatestore.tools.cli import main

    (_, _), (_, spark_reads), checkpoint = both_runs
    done = CliRunner().invoke(main, ["inspect", str(checkpoint), "--families", "--json"])
    assert done.exit_code == 0, done.output
    values: dict[str, int] = {}
    for part in json.loads(done.output)["operators"][0]["partitions"]:
        for family in part["stores"][0]["families"]:
            values[family["name"]] = values.get(family["name"], 0) + family["values"]
    for name in ("count", "seen", "perValue"):
        assert values[name] == len(spark_reads[name]) > 0, (name, values)
    assert {"$eventTimers_keyToTimestamp", "$eventTimers_timestampToKey"} <= set(values)
    plain = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert plain.exit_code == 0 and "--families" in plain.output, plain.output
    report = tmp_path / "report.html"
    done = CliRunner().invoke(main, ["report", str(checkpoint), "-o", str(report)])
    assert done.exit_code == 0, done.output
    page = report.read_text()
    assert "State variables (column families)" in page
    seen = spark_reads["seen"]
    assert f"<td>seen</td><td>{len({row[0] for row in seen}):,}</td><td>{len(seen):,}</td>" in page


def net_changes(feed: list[tuple]) -> list[tuple]:
    """A change feed as each batch's net change per key: its last operation, without deletes of
    keys the batch began without."""
    state: dict = {}
    out = []
    for batch in sorted({r[0] for r in feed}):
        last = {}
        for row in (r for r in feed if r[0] == batch):  # in the order the changes were made
            last[row[2]] = row
        for key, row in sorted(last.items(), key=lambda kv: str(kv[0])):
            if row[1] == "delete" and key not in state:
                continue
            out.append(row)
            if row[1] == "delete":
                state.pop(key)
            else:
                state[key] = row[3]
    return sorted(out)


class Expiring(StatefulProcessor):
    """Processing time: TTL (1 ms: gone by the next batch),
    a list with a TTL, a list seeded from the initial state, and from the fourth run on the value
    `retired` deleted (`deleteIfExists`)."""

    def __init__(self, retire: bool) -> None:
        self.retire = retire

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.last = handle.getValueState("last", "v long", ttlDurationMs=1)
        self.recent = handle.getListState("recent", "v long", ttlDurationMs=1)
        self.items = handle.getListState("items", "v long")
        if self.retire:
            handle.deleteIfExists("retired")
        else:
            self.retired = handle.getValueState("retired", "n long")

    def handleInitialState(self, key, initialState, timerValues) -> None:  # noqa: ANN001, N802, N803
        for v in initialState["init"]:
            self.items.appendValue((int(v),))

    def handleInputRows(self, key, rows, timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802, N803
        expired = [not self.last.exists(), not self.recent.exists()]
        values = sorted(int(v) for frame in rows for v in frame["v"])
        for v in values:
            self.items.appendValue((v,))
            self.recent.appendValue((v,))
        self.last.update((values[-1],))
        if not self.retire:
            self.retired.update((len(values),))
        items = sorted(x[0] for x in self.items.get())
        detail = json.dumps([expired, items])
        yield pd.DataFrame({"key": [key[0]], "kind": ["input"], "n": [len(items)], "detail": [detail]})

    def close(self) -> None:
        pass


def run_until(
    result: DataFrame, checkpoint: Path, out: dict[int, list[tuple]], done: Callable[[], bool], what: str
) -> None:
    """`result` on a 200 ms processing-time trigger, each batch's rows into `out`, until `done()`
    (at most 180 s, else `what` fails the test); then stopped."""
    query = (
        result.writeStream.foreachBatch(lambda df, batch: out.__setitem__(batch, sorted(map(tuple, df.collect()))))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 180
        while not done():
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, what
            time.sleep(0.2)
    finally:
        query.stop()


def run_expiring(spark: SparkSession, root: Path) -> list[list[tuple]]:
    """TTL needs processing time, where Spark runs a batch at every trigger (an availableNow query,
    or processAllAvailable, never ends): each run is a processing-time trigger stopped once the
    batch that read its file is committed, and only the batches that read input are kept (how many
    empty ones run in between is timing)."""
    source, checkpoint = root / "in", root / "checkpoint"
    source.mkdir(parents=True)
    initial = spark.createDataFrame([(f"k{i}", i * 10) for i in range(4)], "k string, init long").groupBy("k")
    out: dict[int, list[tuple]] = {}
    for b in range(BATCHES):
        rows = [{"k": f"k{(b * 5 + i) % 7}", "v": b * 100 + i} for i in range(6)]
        (source / f"{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
        events = spark.readStream.schema("k string, v long").json(str(source))
        result = events.groupBy("k").transformWithStateInPandas(
            Expiring(retire=b >= 3),
            outputStructType=OUTPUT,
            outputMode="Update",
            timeMode="ProcessingTime",
            initialState=initial,
        )

        def read_its_file(b: int = b) -> bool:
            read = sorted(batch for batch, rows in out.items() if rows)
            return len(read) > b and (checkpoint / "commits" / str(read[b])).exists()

        run_until(result, checkpoint, out, read_its_file, f"run {b}: no committed batch read the new file")
    return [rows for _, rows in sorted(out.items()) if rows]


def test_ttl_initial_state_and_a_deleted_variable_equal_rocksdb(tmp_path: Path) -> None:
    with session_on(ROCKSDB) as spark:
        reference = run_expiring(spark, tmp_path / "rocksdb")
    with session_on(None) as spark:
        ours = run_expiring(spark, tmp_path / "ours")
    assert (tmp_path / "ours" / "checkpoint" / "state" / "0" / "0" / "manifests").is_dir()
    seen_again = [json.loads(row[3])[0] for rows in reference for row in rows]
    assert seen_again and all(flags == [True, True] for flags in seen_again), (
        f"values with a TTL of 1 ms must be gone by the next batch: {seen_again[:5]}"
    )
    assert len(ours) == len(reference) == BATCHES
    for batch, (want, got) in enumerate(zip(reference, ours, strict=True)):
        assert got == want, f"run {batch}: {got[:3]} vs {want[:3]}"


class Pinger(StatefulProcessor):
    """Row-based `transformWithState` with processing-time timers: per key a count and its values
    (ValueState, ListState); each input moves the key's one timer (listTimers, deleteTimer) to 1 ms
    after the batch's processing time, so it fires in the next batch, which reports the key's values."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.count = handle.getValueState("count", "n long")
        self.values = handle.getListState("values", "v long")

    def handleInputRows(self, key, rows, timerValues) -> Iterator[Row]:  # noqa: ANN001, N802, N803
        n = self.count.get()[0] if self.count.exists() else 0
        for row in rows:
            n += 1
            self.values.appendValue((row.v,))
        self.count.update((n,))
        for timer in list(self.handle.listTimers()):
            self.handle.deleteTimer(timer)
        self.handle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
        yield Row(key=key[0], kind="input", n=n, detail="")

    def handleExpiredTimer(self, key, timerValues, expiredTimerInfo) -> Iterator[Row]:  # noqa: ANN001, N802, N803
        values = sorted(x[0] for x in self.values.get())
        timers = len(list(self.handle.listTimers()))  # Spark still lists the firing timer here
        yield Row(key=key[0], kind="fired", n=len(values), detail=json.dumps([values, timers]))

    def close(self) -> None:
        pass


def run_pinger(spark: SparkSession, root: Path) -> list[list[tuple]]:
    """BATCHES runs (a restart before each), one input file each, on a processing-time trigger; a run
    stops once the batch after the one that read its file is committed, so that its timers have
    fired. Per run, every row it output (which empty batch a timer fires in is timing)."""
    source, checkpoint = root / "in", root / "checkpoint"
    source.mkdir(parents=True)
    out: dict[int, list[tuple]] = {}
    runs: list[list[tuple]] = []
    for b in range(BATCHES):
        rows = [{"k": f"k{(b * 3 + i) % 8}", "v": b * 10 + i} for i in range(5)]
        (source / f"{b:03d}.json").write_text("\n".join(json.dumps(r) for r in rows))
        events = spark.readStream.schema("k string, v long").json(str(source))
        result = events.groupBy("k").transformWithState(
            Pinger(), outputStructType=OUTPUT, outputMode="Update", timeMode="ProcessingTime"
        )
        started = set(out)

        def timers_fired(started: set[int] = started) -> bool:
            read = [batch for batch in sorted(set(out) - started) if any(r[1] == "input" for r in out[batch])]
            return bool(read) and (checkpoint / "commits" / str(read[0] + 1)).exists() and read[0] + 1 in out

        run_until(
            result, checkpoint, out, timers_fired, f"run {b}: the batch after the one that read its file never ran"
        )
        runs.append(sorted(r for batch in sorted(set(out) - started) for r in out[batch]))
    return runs


def test_row_based_processing_time_timers_equal_rocksdb(tmp_path: Path) -> None:
    with session_on(ROCKSDB) as spark:
        reference = run_pinger(spark, tmp_path / "rocksdb")
    with session_on(None) as spark:
        ours = run_pinger(spark, tmp_path / "ours")
    assert (tmp_path / "ours" / "checkpoint" / "state" / "0" / "0" / "manifests").is_dir()
    fired = [row for rows in reference for row in rows if row[1] == "fired"]
    assert len(fired) >= BATCHES, f"every run's timers must fire: {fired[:5]}"
    assert len(ours) == len(reference) == BATCHES
    for run, (want, got) in enumerate(zip(reference, ours, strict=True)):
        assert got == want, f"run {run}: {got[:4]} vs {want[:4]}"


def test_avro_state_encoding_is_refused_naming_the_conf(tmp_path: Path) -> None:
    """Spark's RocksDB provider encodes Avro itself (a schema id per value, so state written before a
    schema change still decodes); ours keeps UnsafeRows and would read old values as garbage after
    the schema evolved: the query is refused at its first batch, naming the conf to set."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "000.json").write_text(json.dumps({"k": "a", "v": 1, "ts": "2026-01-01 00:00:01"}))
    with session_on(None) as spark:
        spark.conf.set("spark.sql.streaming.stateStore.encodingFormat", "avro")
        events = spark.readStream.schema("k string, v long, ts timestamp").json(str(source))
        query = (
            events.withWatermark("ts", "2 seconds")
            .groupBy("k")
            .transformWithStateInPandas(Tally(), outputStructType=OUTPUT, outputMode="Update", timeMode="EventTime")
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        with pytest.raises(Exception, match="encodingFormat=unsaferow"):
            query.awaitTermination(300)
            raise AssertionError(f"the query was not refused: {query.exception()}")
