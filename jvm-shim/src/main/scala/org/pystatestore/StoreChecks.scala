package org.pystatestore

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals
import org.apache.spark.sql.types.StructType

/**
 * What the provider and its stores refuse or check, and the errors they raise (each names the
 * store it is about).
 */
private[pystatestore] object StoreChecks {
  import ProviderCore.ProviderName

  /**
   * Column families are kept in RocksDB key prefixes, so they need the rocksdb backend; several
   * values per key are kept only in column families (transformWithState's ListState).
   */
  def layoutSupported(
      stateStoreId: StateStoreId,
      useColumnFamilies: Boolean,
      useMultipleValuesPerKey: Boolean,
      usesViews: Boolean,
      encodingFormat: String): Unit = {
    if (useColumnFamilies && !usesViews) {
      throw SparkInternals.multipleColumnFamiliesNotSupported(
        s"$ProviderName with the memory backend (store $stateStoreId); column families need " +
          s"${WorkerLaunchSpec.ConfPrefix}backend=rocksdb, the default")
    }
    if (useColumnFamilies && encodingFormat.equalsIgnoreCase("avro")) {
      // Spark's RocksDB provider does the Avro encoding itself (a schema id per value, so values of
      // an older schema decode after the schema evolved); ours keeps UnsafeRows, and would read an
      // old value with the new schema as garbage.
      throw SparkInternals.unsupportedOperation("spark.sql.streaming.stateStore.encodingFormat=avro",
        s"$ProviderName keeps transformWithState values as UnsafeRows (store $stateStoreId): set " +
          "spark.sql.streaming.stateStore.encodingFormat=unsaferow (the default) before the query's first " +
          "batch; a query whose state schema must evolve needs Spark's RocksDB provider")
    }
    if (useMultipleValuesPerKey && !useColumnFamilies) {
      throw SparkInternals.unsupportedOperation("multiple values per key",
        s"$ProviderName keeps multiple values per key only in column families (store $stateStoreId)")
    }
  }

  def multipleValuesDeclared(family: OpenFamily, operation: String, provider: PythonStateStoreProviderCore): Unit =
    if (!family.spec.multipleValues) {
      throw SparkInternals.unsupportedOperation(operation,
        s"column family ${family.spec.name} of ${provider.describeStore}, which was not created with " +
          "useMultipleValuesPerKey")
    }

  /** The key prefix of a prefix-scan key encoder (None: no prefix); other key encoders are refused. */
  def keyEncoderPrefix(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec): Option[PrefixKeySpec] = keyStateEncoderSpec match {
    case PrefixKeyScanStateEncoderSpec(_, n) => Some(new PrefixKeySpec(keySchema, n))
    case NoPrefixKeyStateEncoderSpec(_) => None
    case other => throw SparkInternals.unsupportedOperation("key encoder",
      s"$ProviderName does not support ${other.getClass.getSimpleName} yet (store $stateStoreId)")
  }

  def replayRange(snapshotVersion: Long, endVersion: Long, provider: PythonStateStoreProviderCore): Unit = {
    if (snapshotVersion < 1 || endVersion < snapshotVersion) {
      throw new IllegalArgumentException(s"$ProviderName cannot replay version $endVersion of " +
        s"${provider.describeStore} from snapshot version $snapshotVersion: the snapshot must be version 1 or " +
        "later and not after the end")
    }
  }

  def noReplayOnMemoryBackend(provider: PythonStateStoreProviderCore): Throwable =
    new UnsupportedOperationException(s"$ProviderName: the memory backend keeps no snapshots to replay " +
      s"from (${provider.describeStore}); write the checkpoint with ${WorkerLaunchSpec.ConfPrefix}backend=rocksdb")

  /** The worker's backend is read as this provider reads it: through views (rocksdb) or frames (memory). */
  def readPathMatches(readPath: String, usesViews: Boolean, provider: PythonStateStoreProviderCore): Unit = {
    if (readPath != (if (usesViews) "view" else "frame")) {
      throw new IllegalStateException(s"pystatestore: the worker's backend for ${provider.describeStore} is read " +
        s"through '$readPath', but this provider expected '${if (usesViews) "view" else "frame"}' " +
        s"(${WorkerLaunchSpec.ConfPrefix}backend). The jar and the Python package are of different releases.")
    }
  }

  def defaultFamily(name: String, provider: PythonStateStoreProviderCore): Unit = {
    if (name != StateStore.DEFAULT_COL_FAMILY_NAME) {
      throw SparkInternals.multipleColumnFamiliesNotSupported(
        s"${ProviderCore.ProviderName} (column family '$name' asked of " +
          s"${provider.describeStore}; column families come in a later pystatestore release)")
    }
  }

  def prefixEnabled(provider: PythonStateStoreProviderCore): Unit = {
    if (provider.prefix.isEmpty) {
      throw new IllegalStateException(s"prefixScan on ${provider.describeStore}, which was not " +
        "opened with a prefix-scan key encoder")
    }
  }

  /** Spark's iterator over `pairs`; closing it (or its task ending) closes `resources` too. */
  def pairs(pairs: Iterator[(UnsafeRow, UnsafeRow)], resources: AutoCloseable = null): StateStoreIterator[UnsafeRowPair] = {
    val pair = new UnsafeRowPair()
    val toClose = Option(resources).orElse(pairs match { case c: AutoCloseable => Some(c); case _ => None })
    new StateStoreIterator(pairs.map { case (k, v) => pair.withRows(k, v) }, () => toClose.foreach(_.close()))
  }

  def noRangeScan(provider: PythonStateStoreProviderCore): Throwable =
    SparkInternals.unsupportedOperation("range scan",
      s"${ProviderCore.ProviderName} does not support range scans yet (${provider.describeStore})")

  def noMultipleValues(provider: PythonStateStoreProviderCore): Throwable =
    SparkInternals.unsupportedOperation("multiple values per key",
      s"${ProviderCore.ProviderName} does not support multiple values per key yet " +
        s"(${provider.describeStore})")
}
