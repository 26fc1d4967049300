package org.pystatestore

import scala.util.control.NonFatal

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals
import org.apache.spark.sql.types.StructType

/**
 * A writable version: its base version + a write buffer, committed through the Python worker; with
 * `forceSnapshot` its commit also makes the new version's snapshot. The adapters make it concrete.
 */
abstract class PythonStateStoreCore(
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion,
    readMarks: WriteBuffer,
    forceSnapshot: Boolean) extends StateStore {
  /** The provider, for the adapters' additions (their errors name its store). */
  protected def storeProvider: PythonStateStoreProviderCore = provider

  private sealed trait Phase
  private case object Updating extends Phase
  private case object Committed extends Phase
  private case object Aborted extends Phase

  @volatile private var phase: Phase = Updating
  private val base = loaded.state
  /** Writes, plus read marks of what Spark's reads found (those of the read store it came from). */
  private val buffer = if (readMarks != null) readMarks else provider.newWriteBuffer()
  private val hold = new BaseHold(provider, base, buffer)
  provider.track(hold)
  private val readBase: UnsafeRow => UnsafeRow = k => base.get(k)
  @volatile private var committed: CommittedVersion = _
  @volatile private var commitMetrics: Map[String, Long] = Map.empty

  override def id: StateStoreId = provider.stateStoreId
  override def version: Long = base.version

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("get")
    buffer.read(key, readBase)
  }

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    StoreChecks.defaultFamily(colFamilyName, provider)
    require(value != null, "Cannot put a null value")
    requireUpdating("put")
    buffer.write(key, value)
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    StoreChecks.defaultFamily(colFamilyName, provider)
    requireUpdating("remove")
    buffer.write(key, null)
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("iterator")
    // The buffer as of now, so concurrent updates neither break nor hide entries; the base is
    // immutable.
    merged(null, base.pairs())
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    StoreChecks.defaultFamily(colFamilyName, provider)
    StoreChecks.prefixEnabled(provider)
    hold.check("prefixScan")
    merged(provider.scanPrefix(prefixKey), base.withPrefix(prefixKey))
  }

  /**
   * The buffer's entries as of now (those with `scanPrefix`, if given), then the base's pairs the
   * buffer did not write or delete by then.
   */
  private def merged(scanPrefix: Array[Byte], fromBase: PairIterator): StateStoreIterator[UnsafeRowPair] = {
    val at = buffer.now
    val anyWrites = buffer.numWrites > 0 // none before `at` either: the base needs no filter
    val fromBuffer = buffer.entriesAt(at, scanPrefix).filter(_._2 != null)
    val notOverridden = if (!anyWrites) fromBase else fromBase.filter { case (k, _) => !buffer.writtenAt(k, at) }
    StoreChecks.pairs(fromBuffer ++ notOverridden, fromBase)
  }

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] =
    throw StoreChecks.noMultipleValues(provider)
  override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit =
    throw StoreChecks.noMultipleValues(provider)
  override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit =
    throw StoreChecks.noMultipleValues(provider)
  override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit =
    throw StoreChecks.noMultipleValues(provider)

  override def removeColFamilyIfExists(colFamilyName: String): Boolean =
    throw SparkInternals.removingColumnFamiliesNotSupported(ProviderCore.ProviderName)

  override def createColFamilyIfAbsent(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit =
    throw SparkInternals.multipleColumnFamiliesNotSupported(ProviderCore.ProviderName)

  override def commit(): Long = {
    requireUpdating("commit")
    hold.check("commit")
    try {
      val (state, metrics) = provider.commitVersion(base, buffer, forceSnapshot)
      // Spark may still read the store after committing (complete mode reads all rows): the store
      // keeps reading base + buffer, which is the committed version, until it is released.
      state.release() // the provider's cache keeps the new version
      committed = state
      commitMetrics = metrics
      phase = Committed
      state.version
    } catch {
      case NonFatal(e) => throw SparkInternals.failedToCommitStateFileError(toString, e)
    }
  }

  override def abort(): Unit = {
    // Nothing reached the worker unless commit() was called; a failed commit cleans up after itself.
    if (phase != Committed) {
      phase = Aborted
      hold.releaseResources() // drops the buffer too
    }
  }

  override def release(): Unit = {
    if (phase != Committed) phase = Aborted
    hold.releaseResources()
  }

  override def hasCommitted: Boolean = phase == Committed

  override def metrics: StateStoreMetrics = {
    val state = committed
    val (keys, memory) = if (state != null) (state.numKeys, state.memoryBytes + buffer.memoryBytes) else {
      var n = base.numKeys
      // Exact, as the commit will count (Spark asks after committing; this is the rare case).
      if (phase == Updating) buffer.foreachWrite() { (flags, page, keyAt, keyLength, _, _) =>
        val present = WriteBuffer.presentInBase(flags)(base.contains(buffer.decodeKey(page, keyAt, keyLength)))
        if (WriteBuffer.isDelete(flags) && present) n -= 1
        else if (!WriteBuffer.isDelete(flags) && !present) n += 1
      }
      (n, base.memoryBytes + buffer.memoryBytes)
    }
    // Memory is reported honestly: the JVM block cache (in a view's memoryBytes) and the worker's
    // resident memory, each shared out over the stores open in this JVM so that sums add up.
    val memoryWithWorker = memory + RocksViews.workerRssShare
    val load = loaded.load
    val loadValues = Map(
      ProviderMetrics.MetricLoadMs -> load.totalMs,
      ProviderMetrics.MetricLoadsFromWorker -> (if (load.fromCache) 0L else 1L),
      ProviderMetrics.MetricLoadedBytes -> load.bytesRead,
      ProviderMetrics.MetricJvmBlockCacheBytes -> RocksViews.blockCacheShare,
      ProviderMetrics.MetricWorkerRssBytes -> RocksViews.workerRssShare)
    // A store may restore twice (once to load, once before committing): sum what both reported.
    val loadSide = load.fromReply ++ loadValues
    val combined = (commitMetrics.keySet ++ loadSide.keySet).map { k =>
      k -> (commitMetrics.getOrElse(k, 0L) + loadSide.getOrElse(k, 0L))
    }.toMap
    StateStoreMetrics(keys, memoryWithWorker, ProviderMetrics.metricsMap(combined), provider.instanceMetrics)
  }

  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo =
    StateStoreCheckpointInfo(id.partitionId, version + 1, None, None)

  private def requireUpdating(op: String): Unit = if (phase != Updating) {
    throw new IllegalStateException(
      s"Cannot $op on $this: it is already ${if (phase == Committed) "committed" else "aborted"}")
  }

  override def toString: String = s"PythonStateStore[${provider.describeStore}, version $version]"
}
