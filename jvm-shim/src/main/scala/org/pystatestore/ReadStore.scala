package org.pystatestore

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._

/** A version handed to a store, with how it was obtained (for load metrics). */
private[pystatestore] case class LoadedVersion(state: CommittedVersion, load: LoadMetrics)

private[pystatestore] case class LoadMetrics(
    fromCache: Boolean, totalMs: Long, bytesRead: Long,
    fromReply: Map[String, Long] = Map.empty)

private[pystatestore] object LoadMetrics {
  val fromCache: LoadMetrics = LoadMetrics(fromCache = true, 0L, 0L)
}

/** What a store holds until it is released: a reference to its base version, open iterators. */
private[pystatestore] trait StoreResources {
  /** Idempotent; called by abort/release, at the end of the store's task, or when the provider closes. */
  def releaseResources(): Unit
}

/** The base version a store reads, held until the store is released (once, whoever asks first). */
private[pystatestore] final class BaseHold(
    provider: PythonStateStoreProviderCore,
    val state: CommittedVersion,
    resources: AutoCloseable = null) extends StoreResources {
  private val released = new java.util.concurrent.atomic.AtomicBoolean(false)

  def check(what: String): Unit = if (released.get) {
    throw new IllegalStateException(s"Cannot $what on a released store of ${provider.describeStore} version " +
      s"${state.version}")
  }

  override def releaseResources(): Unit = if (released.compareAndSet(false, true)) {
    provider.untrack(this)
    if (resources != null) resources.close()
    state.release()
  }
}

/** Read-only view of one loaded version (Spark's ReadStateStore); the adapters make it concrete. */
abstract class PythonReadStateStoreCore(
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion) extends ReadStateStore {
  /** The provider, for the adapters' additions (their errors name its store). */
  protected def storeProvider: PythonStateStoreProviderCore = provider

  /**
   * What Spark's reads found, for the write store this one may be upgraded to. Created lazily;
   * after an upgrade the write store owns it and this store keeps marking into it: Spark upgrades
   * before it reads (the reads happen as the write store's input is consumed).
   */
  private var readMarks: WriteBuffer = _
  private var handedOver = false
  private val hold = new BaseHold(provider, loaded.state, () => synchronized {
    if (readMarks != null && !handedOver) readMarks.close()
    readMarks = null
  })
  provider.track(hold)

  private[pystatestore] def base: LoadedVersion = loaded

  /** A store with column families: reads go to the family's slice of the version. */
  private val families =
    if (provider.columnFamilies) new StoreFamilies(provider, loaded.state, writable = false) else null

  private def familyPairs(name: String, prefixKey: UnsafeRow, operation: String): StateStoreIterator[UnsafeRowPair] = {
    hold.check(operation)
    families.iterator(name, prefixKey, operation)
  }

  /** The read marks, from now on owned (and freed) by the write store this one is upgraded to. */
  private[pystatestore] def handOverReadMarks(): WriteBuffer = synchronized {
    if (readMarks == null) readMarks = provider.newWriteBuffer()
    handedOver = true
    readMarks
  }

  override def id: StateStoreId = provider.stateStoreId
  override def version: Long = loaded.state.version

  override def get(key: UnsafeRow, colFamilyName: String): UnsafeRow = {
    if (families != null) {
      hold.check("get")
      return families.get(colFamilyName, key)
    }
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("get")
    val v = loaded.state.get(key)
    val marks = synchronized {
      if (readMarks == null) readMarks = provider.newWriteBuffer()
      readMarks
    }
    if (marks.isOpen) marks.mark(key, v != null)
    v
  }

  override def valuesIterator(key: UnsafeRow, colFamilyName: String): Iterator[UnsafeRow] = {
    if (families == null) throw StoreChecks.noMultipleValues(provider)
    hold.check("valuesIterator")
    families.forRead(colFamilyName, "valuesIterator").map(families.values(_, key)).getOrElse(Iterator.empty)
  }

  override def prefixScan(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = {
    if (families != null) return familyPairs(colFamilyName, prefixKey, "prefixScan")
    StoreChecks.defaultFamily(colFamilyName, provider)
    StoreChecks.prefixEnabled(provider)
    hold.check("prefixScan")
    StoreChecks.pairs(loaded.state.withPrefix(prefixKey))
  }

  override def iterator(colFamilyName: String): StateStoreIterator[UnsafeRowPair] = {
    if (families != null) return familyPairs(colFamilyName, null, "iterator")
    StoreChecks.defaultFamily(colFamilyName, provider)
    hold.check("iterator")
    StoreChecks.pairs(loaded.state.pairs())
  }

  override def abort(): Unit = hold.releaseResources()
  override def release(): Unit = hold.releaseResources()
  override def toString: String = s"PythonReadStateStore[${provider.describeStore}, version $version]"
}
