"""The demo (scripts/demo.py) stops its query between micro-batches, as a user's first run should
end: `query.stop()` in the middle of a batch interrupts it, and Spark logs the broadcasts it was
writing as ERRORs between the demo's two phases (issue 83's first impressions)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_support import start_session

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from demo import stop_between_batches  # noqa: E402

pytestmark = pytest.mark.spark


def batch_ids(directory: Path) -> set[int]:
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()} if directory.is_dir() else set()


def test_the_demo_stops_its_query_after_the_batch_in_flight_commits(tmp_path: Path) -> None:
    """Asked to stop while a batch runs (its sink still writing), the query stops once that batch
    has committed: every batch Spark planned (offsets/) is in its commit log (commits/), and the
    query ended without an error. A plain `query.stop()` here leaves the batch planned and not
    committed."""
    spark = start_session("local[2]", **{"spark.sql.shuffle.partitions": "2"})
    second_batch_running = threading.Event()

    def slow_sink(df: DataFrame, batch_id: int) -> None:
        df.count()
        if batch_id >= 1:
            second_batch_running.set()
        time.sleep(1.5)  # the trigger interval (3 s) leaves time to stop before the next batch

    try:
        ckpt = tmp_path / "ckpt"
        events = spark.readStream.format("rate").option("rowsPerSecond", 200).load()
        query = (
            events.groupBy((F.col("value") % 50).alias("key"))
            .count()
            .writeStream.outputMode("update")
            .foreachBatch(slow_sink)
            .option("checkpointLocation", str(ckpt))
            .trigger(processingTime="3 seconds")
            .start()
        )
        try:
            assert second_batch_running.wait(120), "the query never ran a second batch"
            stop_between_batches(query)
        finally:
            query.stop()
        assert query.exception() is None
        planned, committed = batch_ids(ckpt / "offsets"), batch_ids(ckpt / "commits")
        assert max(planned) >= 1 and planned == committed, f"planned {sorted(planned)}, committed {sorted(committed)}"
    finally:
        spark.stop()
