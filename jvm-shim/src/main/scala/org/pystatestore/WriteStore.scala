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
  /** A store with column families: every call goes to its family (the buffer above stays empty). */
  private val families = if (provider.columnFamilies) new StoreFamilies(provider, base, writable = true) else null
  private val hold = new BaseHold(provider, base, () => {
    buffer.close()
    if (families != null) families.close()
  })
  provider.track(hold)
  private val readBase: UnsafeRow => UnsafeRow = k => base.get(k)
  @volatile private var committed: CommittedVersion = _
  @volatile private var commitMetrics: Map[String, Long] = Map.empty

  override def id: StateStoreId = provider.stateStoreId
  override def version: Long = base.version

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    if (families != null) {
      hold.check("get")
      return families.get(colFamilyName, key)
    }
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("get")
    buffer.read(key, readBase)
  }

  override def put(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit = {
    if (families == null) StoreChecks.defaultFamily(colFamilyName, provider)
    require(value != null, "Cannot put a null value")
    requireUpdating("put")
    if (families != null) {
      val f = families.forWrite(colFamilyName, "put")
      f.buffer.write(key, if (f.spec.multipleValues) ValueLists.encode(Seq(value)) else value)
      return
    }
    buffer.write(key, value)
  }

  override def remove(key: UnsafeRow, colFamilyName: String): Unit = {
    if (families == null) StoreChecks.defaultFamily(colFamilyName, provider)
    requireUpdating("remove")
    if (families != null) families.forRead(colFamilyName, "remove").foreach(_.buffer.write(key, null))
    else buffer.write(key, null)
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    if (families != null) {
      hold.check("iterator")
      return families.iterator(colFamilyName, null, "iterator")
    }
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("iterator")
    // The buffer as of now, so concurrent updates neither break nor hide entries; the base is
    // immutable.
    merged(null, base.pairs())
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    if (families != null) {
      hold.check("prefixScan")
      return families.iterator(colFamilyName, prefixKey, "prefixScan")
    }
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

  /** A multi-value family of this store (several values per key are kept only in column families). */
  private def multiValueFamily(name: String, operation: String, write: Boolean): Option[OpenFamily] = {
    if (families == null) throw StoreChecks.noMultipleValues(provider)
    hold.check(operation)
    if (write) requireUpdating(operation)
    val f = if (write) Some(families.forWrite(name, operation)) else families.forRead(name, operation)
    f.foreach(StoreChecks.multipleValuesDeclared(_, operation, provider))
    f
  }

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] =
    multiValueFamily(colFamilyName, "valuesIterator", write = false).map(families.values(_, key)).getOrElse(Iterator.empty)

  override def merge(key: UnsafeRow, value: UnsafeRow, colFamilyName: String): Unit =
    mergeList(key, Array(value), colFamilyName)

  override def putList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    require(values != null && values.nonEmpty && !values.contains(null), "Cannot put an empty list or a null value")
    multiValueFamily(colFamilyName, "putList", write = true).foreach(_.buffer.write(key, ValueLists.encode(values)))
  }

  override def mergeList(key: UnsafeRow, values: Array[UnsafeRow], colFamilyName: String): Unit = {
    require(values != null && values.nonEmpty && !values.contains(null), "Cannot merge an empty list or a null value")
    multiValueFamily(colFamilyName, "merge", write = true).foreach { f =>
      f.buffer.write(key, ValueLists.append(f.stored(key), values))
    }
  }

  override def removeColFamilyIfExists(colFamilyName: String): Boolean = {
    if (families == null) throw SparkInternals.removingColumnFamiliesNotSupported(ProviderCore.ProviderName)
    requireUpdating("removeColFamilyIfExists")
    families.remove(colFamilyName)
  }

  override def createColFamilyIfAbsent(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit = {
    if (families == null) throw SparkInternals.multipleColumnFamiliesNotSupported(ProviderCore.ProviderName)
    // Names starting with '$' are Spark's own (timers, TTL indexes): counted apart (numKeys leaves
    // them out), so a user's family may not take one, as Spark's RocksDB provider refuses it too.
    if (!isInternal && FamilySpec.isInternalName(colFamilyName)) {
      throw SparkInternals.cannotCreateColumnFamilyWithReservedChars(colFamilyName)
    }
    provider.declareFamily(FamilySpec(colFamilyName, keySchema, valueSchema, keyStateEncoderSpec,
      useMultipleValuesPerKey))
    if (phase == Updating) families.create(colFamilyName)
  }

  override def commit(): Long = {
    requireUpdating("commit")
    hold.check("commit")
    try {
      val parts = if (families != null) families.commitParts else Seq(CommitPart(buffer, base, internal = false))
      // Spark's RocksDB provider snapshots a version that created or removed a column family, and
      // its state reader's snapshotStartBatchId relies on it (PySpark's own suites read batch 0 so).
      val snapshot = forceSnapshot || (families != null && families.familiesChanged)
      val (state, metrics) = provider.commitVersion(base, parts, snapshot)
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
    val buffered = buffer.memoryBytes + (if (families != null) families.memoryBytes else 0L)
    // Spark's numKeys: internal families (timers, TTL indexes, our registry) are left out.
    val (keys, memory) = if (state != null) (state.numKeys - state.numInternalKeys, state.memoryBytes + buffered)
    else if (families != null) (base.numKeys - base.numInternalKeys, base.memoryBytes + buffered) // counted at commit
    else {
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

  /**
   * Spark's checkpoint format v2: the id of the version this store committed (its manifest id) and
   * of the version it was committed on (None on version 0), which Spark writes to its commit log
   * and hands back when it loads the version. Format v1 records no ids.
   */
  override def getStateStoreCheckpointInfo(): StateStoreCheckpointInfo = {
    val state = committed
    if (!provider.checkpointIds || state == null) StateStoreCheckpointInfo(id.partitionId, version + 1, None, None)
    else StateStoreCheckpointInfo(id.partitionId, state.version, Some(state.manifestId),
      Option(base.manifestId).filter(id => base.version > 0 && id.nonEmpty))
  }

  private def requireUpdating(op: String): Unit = if (phase != Updating) {
    throw new IllegalStateException(
      s"Cannot $op on $this: it is already ${if (phase == Committed) "committed" else "aborted"}")
  }

  override def toString: String = s"PythonStateStore[${provider.describeStore}, version $version]"
}
