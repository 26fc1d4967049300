package org.pystatestore

import java.io.File
import java.util.UUID

import scala.collection.mutable
import scala.util.control.NonFatal

import org.json4s._

import org.apache.spark.sql.catalyst.expressions.UnsafeRow

/**
 * A provider's committed versions in this JVM: the recent ones it keeps, and the worker calls that
 * bring one here (a load, a replay from a snapshot, the view a durable-first commit makes after its
 * reply). A version is a read-only RocksDB view the worker leaves on local disk (rocksdb backend,
 * `usesViews`) or a heap version built from a frame (memory backend). The cache holds one reference
 * to each version it keeps: open read views, or persistent maps that share structure, so keeping
 * `versionsInMemory` of them is cheap. Every version handed out holds one reference for the caller.
 */
private[pystatestore] final class StoreVersions(
    session: StoreSession,
    keyCodec: KeyCodec,
    usesViews: Boolean,
    prefixSpec: Option[PrefixKeySpec],
    numKeyFields: Int,
    numValueFields: Int,
    versionsInMemory: Int,
    describeStore: String) {
  import StoreVersions._
  import WorkerReplies._
  import ProviderMetrics.replyMetrics

  private val cachedVersions = new mutable.LinkedHashMap[Long, CommittedVersion]()

  /** Time reads waited for views made after their commits replied, since the last commit's metrics. */
  private val viewWaitNanos = new java.util.concurrent.atomic.AtomicLong(0L)

  /** An empty version: what a store starts from before its first commit. */
  def empty(version: Long): CommittedVersion = VersionState.empty(version, prefixSpec.isDefined && !usesViews)

  /** `version` from the cache, else from the worker; under checkpoint format v2, the attempt `uniqueId`. */
  def load(version: Long, uniqueId: Option[String]): LoadedVersion = {
    val cached = synchronized {
      // Under checkpoint format v2 a cached version serves only the attempt Spark names.
      val c = cachedVersions.get(version).filter(isAttempt(_, uniqueId))
      c.foreach(_.retain())
      c
    }
    cached match {
      case Some(state) => LoadedVersion(state, LoadMetrics.fromCache)
      case None if version == 0 => LoadedVersion(empty(0), LoadMetrics.fromCache)
      case None => loadFromWorker(version, uniqueId)
    }
  }

  private def loadFromWorker(version: Long, uniqueId: Option[String]): LoadedVersion = {
    val started = System.nanoTime()
    val worker = session.worker()
    val file = new File(worker.exchangeDir, s"load-${UUID.randomUUID()}.arrow")
    val viewDir = new File(StateWorker.viewsDir, s"v$version-${UUID.randomUUID()}")
    try {
      val reply = session.call(worker, s"load of $describeStore version $version") { (svc, h) =>
        svc.load(h, version, uniqueId.getOrElse(""), file.getAbsolutePath,
          if (usesViews) viewDir.getAbsolutePath else "")
      }
      RocksViews.noteWorkerRss(worker.slot, longField(reply, "workerRssBytes"))
      val state: CommittedVersion = if (usesViews) {
        new RocksView(viewDir, version, stringField(reply, "manifestId"), longField(reply, "numKeys"),
          longField(reply, "numInternalKeys"), keyCodec, numValueFields, describeStore)
      } else {
        val prefixOf = prefixSpec.map { spec =>
          val proj = spec.newProjection()
          (k: UnsafeRow) => proj(k).copy()
        }
        val rows = mutable.ArrayBuffer.empty[(UnsafeRow, UnsafeRow)]
        ArrowFrames.readState(file) { (k, v) => rows += (toRow(k, numKeyFields) -> toRow(v, numValueFields)) }
        VersionState.build(version, stringField(reply, "manifestId"), rows.iterator, prefixOf)
      }
      state.retain() // one reference for the cache, one for the caller
      remember(state)
      loaded(state, reply, started)
    } catch {
      case NonFatal(e) =>
        StateWorker.deleteRecursively(viewDir) // a view of a failed load is nobody's
        throw e
    } finally file.delete()
  }

  private def loaded(state: CommittedVersion, reply: JValue, startedNanos: Long): LoadedVersion =
    LoadedVersion(state, LoadMetrics(
      fromCache = false,
      totalMs = (System.nanoTime() - startedNanos) / 1000000,
      bytesRead = longField(reply, "bytes"),
      fromReply = replyMetrics(reply)))

  /**
   * `endVersion` rebuilt in the worker from the snapshot of `snapshotVersion` and the changes after
   * it, as a view (rocksdb backend only). Not kept: it is what a damaged later snapshot would
   * otherwise hide.
   */
  def replay(
      snapshotVersion: Long,
      snapshotId: Option[String],
      endVersion: Long,
      endId: Option[String]): LoadedVersion = {
    val started = System.nanoTime()
    val worker = session.worker()
    val viewDir = new File(StateWorker.viewsDir, s"v$endVersion-replay-${UUID.randomUUID()}")
    try {
      val reply = session.call(worker, s"replay of $describeStore version $endVersion from snapshot $snapshotVersion") {
        (svc, h) => svc.replay(h, snapshotVersion, snapshotId.getOrElse(""), endVersion, endId.getOrElse(""),
          viewDir.getAbsolutePath)
      }
      loaded(new RocksView(viewDir, endVersion, stringField(reply, "manifestId"), longField(reply, "numKeys"),
        longField(reply, "numInternalKeys"), keyCodec, numValueFields, describeStore), reply, started)
    } catch {
      case NonFatal(e) =>
        StateWorker.deleteRecursively(viewDir)
        throw e
    }
  }

  /**
   * What the first read of a version committed durable first does before opening its view: waits
   * for the worker to have made it (or to have loaded the version there, if making it failed or
   * that worker died). A failure forgets the version and those built on it, so Spark's retry of
   * the task loads what the checkpoint holds.
   */
  def viewMadeAfterCommit(version: Long, manifestId: String, viewDir: File): () => Unit = () => {
    // RocksDB makes a checkpoint under another name and renames it into place, and the worker never
    // removes one it made: a directory that is there is the whole view, and needs no call.
    if (!viewDir.isDirectory) awaitViewFromWorker(version, manifestId, viewDir)
  }

  private def awaitViewFromWorker(version: Long, manifestId: String, viewDir: File): Unit = {
    val started = System.nanoTime()
    try {
      val worker = session.worker()
      val reply = session.call(worker, s"read view of $describeStore version $version") { (svc, h) =>
        svc.awaitView(h, version, manifestId, viewDir.getAbsolutePath)
      }
      RocksViews.noteWorkerRss(worker.slot, longField(reply, "workerRssBytes"))
    } catch {
      case NonFatal(e) =>
        forgetFrom(version)
        throw e
    } finally viewWaitNanos.addAndGet(System.nanoTime() - started)
  }

  /** Milliseconds reads waited for views made after their commits, since the last call. */
  def takeViewWaitMs(): Long = viewWaitNanos.getAndSet(0L) / 1000000

  /** Keeps `state` (it holds a reference for the cache); the oldest beyond the limit are released. */
  def remember(state: CommittedVersion): Unit = {
    val evicted = synchronized {
      val out = mutable.ListBuffer.empty[CommittedVersion]
      cachedVersions.remove(state.version).foreach(out += _)
      cachedVersions.put(state.version, state)
      while (cachedVersions.size > versionsInMemory) {
        val (v, old) = cachedVersions.head
        cachedVersions.remove(v)
        out += old
      }
      out.toList
    }
    evicted.foreach(RocksViews.releaseLater)
  }

  /** Forgets `version` and every later one kept: the checkpoint no longer holds what they were built on. */
  def forgetFrom(version: Long): Unit = {
    val dropped = synchronized {
      val vs = cachedVersions.keys.filter(_ >= version).toList
      vs.flatMap(cachedVersions.remove)
    }
    dropped.foreach(_.release())
  }

  /** Every kept version, no longer kept: the caller releases their references. */
  def takeAll(): List[CommittedVersion] = synchronized {
    val all = cachedVersions.values.toList
    cachedVersions.clear()
    all
  }
}

private[pystatestore] object StoreVersions {
  /** `state` is the attempt `uniqueId` names (any attempt when Spark names none). */
  def isAttempt(state: CommittedVersion, uniqueId: Option[String]): Boolean =
    state.version == 0 || uniqueId.forall(_ == state.manifestId)
}
