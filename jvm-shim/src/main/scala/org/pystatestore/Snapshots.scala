package org.pystatestore

import java.util.concurrent.{ConcurrentHashMap, Executors, ThreadFactory}
import java.util.concurrent.atomic.AtomicBoolean

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.spark.internal.Logging
import org.apache.spark.sql.execution.streaming.state.StateStoreProviderId
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals

/**
 * Tells Spark's state store coordinator about each snapshot a store makes, as Spark's own providers
 * do; from Spark 4.2 a store that never reports is judged lagging, and Spark then forces a snapshot
 * on every one of its commits.
 *
 * Reports go to the driver from one daemon thread per JVM, not from the thread that made the
 * snapshot: a snapshot-mode commit is a snapshot, and a round trip to the driver in every commit
 * would sit on the commit path (200 a batch at Spark's default partitions). The coordinator keeps
 * only each store's newest snapshot, so reports still waiting are merged per store.
 */
private[pystatestore] object SnapshotReports extends Logging {
  private case class Report(version: Long, timestampMs: Long)

  private val pending = new ConcurrentHashMap[StateStoreProviderId, Report]()
  private val scheduled = new AtomicBoolean(false)
  private lazy val sender = Executors.newSingleThreadExecutor(new ThreadFactory {
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, "pystatestore-snapshot-reports")
      t.setDaemon(true)
      t
    }
  })

  /** Queues the report that `version` of the store `id` is a snapshot, made now. */
  def snapshotMade(id: StateStoreProviderId, version: Long): Unit = {
    val now = System.currentTimeMillis()
    pending.merge(id, Report(version, now), (old, fresh) => if (fresh.version >= old.version) fresh else old)
    if (scheduled.compareAndSet(false, true)) sender.execute(() => sendPending())
  }

  private def sendPending(): Unit = {
    scheduled.set(false) // a report queued from here on schedules another round
    for ((id, report) <- pending.asScala.toList if pending.remove(id, report)) {
      try SparkInternals.reportSnapshotUploaded(id, report.version, report.timestampMs)
      catch {
        case NonFatal(e) =>
          logWarning(s"pystatestore: could not tell Spark's state store coordinator that version " +
            s"${report.version} of ${id.storeId} is a snapshot (the next snapshot reports again): $e")
      }
    }
  }
}

/**
 * Snapshots made as soon as a commit makes one due, rather than at Spark's next maintenance: at its
 * default interval (60 s) tens of fast batches pass between maintenance runs, so a store's changelog
 * chain (what a restore replays) grew far past minDeltasForSnapshot, and once it trailed by 5 x
 * minDeltasForSnapshot versions Spark's coordinator judged the store lagging and forced a snapshot
 * on every commit. The snapshot is the same call Spark's maintenance thread makes, run on a small
 * daemon pool of this JVM: the task that committed does not wait for it.
 */
private[pystatestore] object SnapshotRequests {
  private lazy val pool = Executors.newFixedThreadPool(2, new ThreadFactory {
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, "pystatestore-snapshots")
      t.setDaemon(true)
      t
    }
  })

  def submit(job: Runnable): Unit = pool.execute(job)
}
