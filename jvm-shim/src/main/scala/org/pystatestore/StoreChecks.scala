package org.pystatestore

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals

private[pystatestore] object StoreChecks {
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
