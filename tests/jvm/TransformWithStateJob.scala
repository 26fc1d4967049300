package org.pystatestore.tests

import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Path, Paths, StandardOpenOption}
import java.sql.Timestamp
import java.time.Duration
import java.util.concurrent.atomic.AtomicLong

import org.apache.spark.sql.{Dataset, Encoders, SparkSession}
import org.apache.spark.sql.streaming.{ExpiredTimerInfo, ListState, MapState, OutputMode, StatefulProcessor,
  TTLConfig, TimeMode, TimerValues, Trigger, ValueState}

case class TwsEvent(key: String, v: Long, ts: Timestamp)
case class TwsInput(key: String, v: Long)
case class TwsOut(key: String, kind: String, n: Long, detail: String)

/**
 * Event time. Per key: a count (ValueState), every value seen (ListState) and a count per value
 * (MapState; a value seen a third time is removed from it), and an event-time timer 5 s after the
 * key's newest event. Keys of even count replace their earlier timers (deleteTimer), keys of odd
 * count keep them, so a key can have two timers fire in one batch. A timer reports the key and
 * clears its state.
 */
class EventTimeTally extends StatefulProcessor[String, TwsEvent, TwsOut] {
  @transient private var count: ValueState[Long] = _
  @transient private var seen: ListState[Long] = _
  @transient private var perValue: MapState[Long, Long] = _

  override def init(outputMode: OutputMode, timeMode: TimeMode): Unit = {
    count = getHandle.getValueState[Long]("count", Encoders.scalaLong, TTLConfig.NONE)
    seen = getHandle.getListState[Long]("seen", Encoders.scalaLong, TTLConfig.NONE)
    perValue = getHandle.getMapState[Long, Long]("perValue", Encoders.scalaLong, Encoders.scalaLong, TTLConfig.NONE)
  }

  override def handleInputRows(key: String, rows: Iterator[TwsEvent], timerValues: TimerValues): Iterator[TwsOut] = {
    var n = if (count.exists()) count.get() else 0L
    var newest = 0L
    for (e <- rows) {
      n += 1
      seen.appendValue(e.v)
      val c = if (perValue.containsKey(e.v)) perValue.getValue(e.v) else 0L
      if (c + 1 >= 3) perValue.removeKey(e.v) else perValue.updateValue(e.v, c + 1)
      newest = math.max(newest, e.ts.getTime)
    }
    count.update(n)
    if (n % 2 == 0) getHandle.listTimers().foreach(getHandle.deleteTimer)
    getHandle.registerTimer(newest + 5000)
    val detail = Seq(
      "seen=" + seen.get().toSeq.sorted.mkString(","),
      "perValue=" + perValue.iterator().toSeq.sorted.mkString(","),
      "timers=" + getHandle.listTimers().toSeq.sorted.mkString(","),
      "watermark=" + timerValues.getCurrentWatermarkInMs()
    ).mkString(" ")
    Iterator(TwsOut(key, "input", n, detail))
  }

  override def handleExpiredTimer(key: String, timerValues: TimerValues,
      expiredTimerInfo: ExpiredTimerInfo): Iterator[TwsOut] = {
    val n = if (count.exists()) count.get() else -1L
    count.clear()
    seen.clear()
    perValue.clear()
    val detail = s"expiry=${expiredTimerInfo.getExpiryTimeInMs()} watermark=${timerValues.getCurrentWatermarkInMs()}"
    Iterator(TwsOut(key, "expired", n, detail))
  }
}

/**
 * Processing time. Per key: every value (ListState, appendList) and how often its timer fired
 * (ValueState), which outlive batches, and the last value (ValueState), the batch's values
 * (ListState) and a tag per value (MapState), all with a TTL of 1 ms: gone by the next batch. Each
 * input registers a processing-time timer 1 ms ahead, which fires in the next batch. Nothing here
 * depends on the clock's value: rows report whether the TTL state was gone, not when.
 */
class ProcessingTimeExpiry extends StatefulProcessor[String, TwsInput, TwsOut] {
  @transient private var items: ListState[Long] = _
  @transient private var fired: ValueState[Long] = _
  @transient private var last: ValueState[Long] = _
  @transient private var recent: ListState[Long] = _
  @transient private var tags: MapState[Long, String] = _

  override def init(outputMode: OutputMode, timeMode: TimeMode): Unit = {
    val ttl = TTLConfig(Duration.ofMillis(1))
    items = getHandle.getListState[Long]("items", Encoders.scalaLong, TTLConfig.NONE)
    fired = getHandle.getValueState[Long]("fired", Encoders.scalaLong, TTLConfig.NONE)
    last = getHandle.getValueState[Long]("last", Encoders.scalaLong, ttl)
    recent = getHandle.getListState[Long]("recent", Encoders.scalaLong, ttl)
    tags = getHandle.getMapState[Long, String]("tags", Encoders.scalaLong, Encoders.STRING, ttl)
  }

  private def report(key: String, kind: String, n: Long): TwsOut = {
    val gone = Seq(!last.exists(), !recent.exists(), !tags.exists()).mkString(",")
    TwsOut(key, kind, n, s"gone=$gone items=${items.get().toSeq.sorted.mkString(",")}")
  }

  override def handleInputRows(key: String, rows: Iterator[TwsInput], timerValues: TimerValues): Iterator[TwsOut] = {
    val values = rows.map(_.v).toArray.sorted
    val gone = report(key, "input", values.length)
    items.appendList(values)
    values.foreach { v =>
      recent.appendValue(v)
      tags.updateValue(v, s"t$v")
    }
    last.update(values.last)
    getHandle.registerTimer(timerValues.getCurrentProcessingTimeInMs() + 1)
    Iterator(gone, report(key, "stored", values.length))
  }

  override def handleExpiredTimer(key: String, timerValues: TimerValues,
      expiredTimerInfo: ExpiredTimerInfo): Iterator[TwsOut] = {
    val n = (if (fired.exists()) fired.get() else 0L) + 1
    fired.update(n)
    Iterator(report(key, "timer", n))
  }
}

/**
 * transformWithState jobs compiled by the test suite. One invocation is one phase: for each
 * provider given, on checkpoints of its own, it runs the event-time query over the files not yet
 * read (AvailableNow, one file per micro-batch) and the processing-time query until the batch
 * after the one that read the new file is committed (its timers have fired then); it appends
 * "batchId<TAB>rows" lines to <workDir>/{event,processing}-<provider>.out. With "read", it then
 * writes what Spark's state data source reads of every state variable to <workDir>/state-<provider>.out.
 * Arguments: work dir (holding in-event/ and in-processing/), "run" or "read", provider class names...
 */
object TransformWithStateJob {
  def appendLine(path: Path, line: String): Unit =
    Files.write(path, (line + "\n").getBytes(StandardCharsets.UTF_8), StandardOpenOption.CREATE,
      StandardOpenOption.APPEND)

  def recorder(out: Path, onBatch: (Long, Array[TwsOut]) => Unit = (_, _) => ()): (Dataset[TwsOut], Long) => Unit =
    (batch, batchId) => {
      val rows = batch.collect()
      appendLine(out, s"$batchId\t${rows.map(_.toString).sorted.mkString("|")}")
      onBatch(batchId, rows)
    }

  def main(args: Array[String]): Unit = {
    val (workDir, mode, providers) = (args(0), args(1), args.drop(2).toSeq)
    val spark = SparkSession.builder().appName("pystatestore-transform-with-state")
      .config("spark.sql.shuffle.partitions", "3").getOrCreate()
    import spark.implicits._
    for (provider <- providers) {
      spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
      val name = provider.split('.').last

      val events = spark.readStream.schema("key string, v long, ts timestamp").option("maxFilesPerTrigger", 1)
        .json(s"$workDir/in-event").as[TwsEvent]
      val tallies = events.withWatermark("ts", "2 seconds").groupByKey(_.key)
        .transformWithState(new EventTimeTally, TimeMode.EventTime(), OutputMode.Update())
      val eventQuery = tallies.writeStream.outputMode(OutputMode.Update())
        .foreachBatch(recorder(Paths.get(workDir, s"event-$name.out")))
        .option("checkpointLocation", s"$workDir/ckpt-event-$name").trigger(Trigger.AvailableNow()).start()
      eventQuery.awaitTermination()

      // Processing time runs a batch at every trigger, so the query never ends by itself: it stops
      // once the batch after the one that read this phase's file is committed.
      val inputBatch = new AtomicLong(-1)
      val checkpoint = s"$workDir/ckpt-processing-$name"
      val inputs = spark.readStream.schema("key string, v long").json(s"$workDir/in-processing").as[TwsInput]
      val expiring = inputs.groupByKey(_.key)
        .transformWithState(new ProcessingTimeExpiry, TimeMode.ProcessingTime(), OutputMode.Update())
      val onBatch = (batchId: Long, rows: Array[TwsOut]) => {
        if (rows.exists(_.kind == "input")) inputBatch.compareAndSet(-1, batchId)
        ()
      }
      val processingQuery = expiring.writeStream.outputMode(OutputMode.Update())
        .foreachBatch(recorder(Paths.get(workDir, s"processing-$name.out"), onBatch))
        .option("checkpointLocation", checkpoint).trigger(Trigger.ProcessingTime("200 milliseconds")).start()
      val deadline = System.nanoTime() + 180L * 1000 * 1000 * 1000
      def timersFired: Boolean =
        inputBatch.get >= 0 && Files.exists(Paths.get(checkpoint, "commits", (inputBatch.get + 1).toString))
      while (!timersFired) {
        processingQuery.exception.foreach(e => throw e)
        require(System.nanoTime() < deadline, s"$name: no committed batch after the one that read the new file")
        Thread.sleep(100)
      }
      processingQuery.stop()
      processingQuery.exception.foreach(e => throw e)

      if (mode == "read") {
        val out = Paths.get(workDir, s"state-$name.out")
        val reads = Seq("event" -> Seq("count", "seen", "perValue"),
          "processing" -> Seq("items", "fired", "last", "recent", "tags"))
        for ((query, variables) <- reads) {
          val path = s"$workDir/ckpt-$query-$name"
          val readers = variables.map(v => v -> spark.read.format("statestore").option("stateVarName", v)) :+
            ("timers" -> spark.read.format("statestore").option("readRegisteredTimers", "true"))
          for ((variable, reader) <- readers) {
            val rows = reader.option("path", path).load().collect().map(_.toString).sorted
            rows.foreach(row => appendLine(out, s"$query.$variable\t$row"))
            if (rows.isEmpty) appendLine(out, s"$query.$variable\t")
          }
        }
      }
    }
    spark.stop()
  }
}
