package org.pystatestore.bench

import java.sql.Timestamp

import org.apache.spark.sql.{DataFrame, SparkSession}
import org.apache.spark.sql.streaming.{GroupState, GroupStateTimeout, OutputMode}

case class SessionInput(key: Long, value: Long, ts: Timestamp)
case class SessionBuffer(n: Long, events: String)
case class SessionCount(key: Long, n: Long)

/**
 * scripts/bench.py's large-value workload in Scala (`--workload flatmap-sessions`): flatMapGroupsWithState
 * keeping, per key, a count and its newest 64 events of 64 bytes as one string (about 4 KiB of state),
 * the same events as the applyInPandasWithState workload (`session_event` there), so that the two
 * differ only in where the function runs.
 */
object SessionBuffers {
  val EventBytes = 64
  val EventsKept = 64
  private val Kinds = Array("view", "click", "cart", "search", "scroll", "buy")

  /** One event as fixed-width text, as compressible as a log line. */
  def event(key: Long, value: Long, tsMs: Long): String = {
    val page = (key * 7919 + value * 104729) % 1000003
    val request = java.lang.Long.toHexString((key * 0x9E3779B97F4A7C15L) ^ (tsMs * 0xBF58476D1CE4E5B9L) ^ value)
    val rid = "0" * (16 - request.length) + request
    val text = f"$tsMs%013d|${Kinds((value % 6).toInt)}%-6s|/p/$page%07d|v=$value%04d|rid=$rid|"
    text + "-" * (EventBytes - text.length)
  }

  /** A new key starts from its history, as a query started over a backlog would have it. */
  def update(key: Long, rows: Iterator[SessionInput], state: GroupState[SessionBuffer]): Iterator[SessionCount] = {
    val (before, history) = state.getOption match {
      case Some(s) => (s.n, s.events)
      case None => (0L, (0 until EventsKept).map(h => event(key, h, h * 1000L)).mkString)
    }
    val events = new java.lang.StringBuilder(history)
    var n = before
    rows.foreach { r =>
      events.append(event(key, r.value, r.ts.getTime))
      n += 1
    }
    val kept = EventsKept * EventBytes
    state.update(SessionBuffer(n, events.substring(math.max(0, events.length - kept))))
    Iterator(SessionCount(key, n))
  }

  /** The query's result over the parquet files in `inputDir`, one file per batch. */
  def sessions(spark: SparkSession, inputDir: String): DataFrame = {
    import spark.implicits._
    spark.readStream.schema("key long, value long, ts timestamp").option("maxFilesPerTrigger", 1)
      .parquet(inputDir).as[SessionInput]
      .groupByKey(_.key)
      .flatMapGroupsWithState(OutputMode.Update, GroupStateTimeout.NoTimeout)(update _)
      .toDF()
  }
}
