package org.pystatestore.tests

import java.nio.charset.StandardCharsets
import java.nio.file.{Files, Paths, StandardOpenOption}
import java.sql.Timestamp

import org.apache.spark.sql.{Dataset, SparkSession}
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode, Trigger}

case class Event(user: String, ts: Timestamp)
case class SessionInfo(count: Long, start: Long, end: Long)
case class SessionUpdate(user: String, count: Long, start: Long, end: Long, expired: Boolean)

/**
 * A Scala flatMapGroupsWithState sessionization job, compiled by the test suite. One invocation is
 * one phase: it runs the query over what is available for each provider given, on its own
 * checkpoint, and appends "batchId<TAB>rows" lines to <workDir>/<provider>.out.
 * Arguments: input dir, work dir, provider class names...
 */
object Sessionization {
  val GapMs = 10000L

  def updateSession(user: String, events: Iterator[Event], state: GroupState[SessionInfo]): Iterator[SessionUpdate] = {
    if (state.hasTimedOut) {
      val s = state.get
      state.remove()
      Iterator(SessionUpdate(user, s.count, s.start, s.end, expired = true))
    } else {
      val times = events.map(_.ts.getTime).toSeq
      val merged = state.getOption match {
        case Some(s) => SessionInfo(s.count + times.size, (s.start +: times).min, (s.end +: times).max)
        case None => SessionInfo(times.size, times.min, times.max)
      }
      state.update(merged)
      state.setTimeoutTimestamp(merged.end + GapMs)
      Iterator(SessionUpdate(user, merged.count, merged.start, merged.end, expired = false))
    }
  }

  def main(args: Array[String]): Unit = {
    val (inputDir, workDir, providers) = (args(0), args(1), args.drop(2).toSeq)
    val spark = SparkSession.builder().appName("pystatestore-sessionization")
      .config("spark.sql.shuffle.partitions", "3").getOrCreate()
    import spark.implicits._
    for (provider <- providers) {
      spark.conf.set("spark.sql.streaming.stateStore.providerClass", provider)
      val name = provider.split('.').last
      val out = Paths.get(workDir, s"$name.out")
      val events = spark.readStream.schema("id long, key string, value long, ts timestamp")
        .option("maxFilesPerTrigger", 1).json(inputDir)
        .selectExpr("key as user", "ts").as[Event]
      val sessions = events.withWatermark("ts", "5 seconds").groupByKey(_.user)
        .flatMapGroupsWithState(OutputMode.Update, GroupStateTimeout.EventTimeTimeout)(updateSession)
      val record: (Dataset[SessionUpdate], Long) => Unit = (batch, batchId) => {
        val rows = batch.collect().map(_.toString).sorted.mkString("|")
        Files.write(out, s"$batchId\t$rows\n".getBytes(StandardCharsets.UTF_8),
          StandardOpenOption.CREATE, StandardOpenOption.APPEND)
      }
      val query = sessions.writeStream.outputMode(OutputMode.Update).foreachBatch(record)
        .option("checkpointLocation", s"$workDir/ckpt-$name").trigger(Trigger.AvailableNow()).start()
      query.awaitTermination()
    }
    spark.stop()
  }
}
