package org.pystatestore

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore, StateStoreIterator, UnsafeRowPair}

/**
 * What Spark 4.2 added to ReadStateStore, for both our stores (4.2 and 4.3 alike): `multiGet` is
 * served for real (one lookup per key); multiple values per key and range scans are refused with
 * Spark's error classes, naming the store, as `init` refuses the operators that need them.
 */
trait ReadStoreSince42 extends ReadStateStore {
  protected def storeProvider: PythonStateStoreProviderCore

  override def multiGet(keys: Array[UnsafeRow], colFamilyName: String): Iterator[UnsafeRow] =
    keys.iterator.map(k => get(k, colFamilyName))

  override def prefixScanWithMultiValues(prefixKey: UnsafeRow, colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = throw StoreChecks.noMultipleValues(storeProvider)

  override def iteratorWithMultiValues(colFamilyName: String): StateStoreIterator[UnsafeRowPair] =
    throw StoreChecks.noMultipleValues(storeProvider)

  override def rangeScan(startKey: Option[UnsafeRow], endKey: Option[UnsafeRow], colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = throw StoreChecks.noRangeScan(storeProvider)

  override def rangeScanWithMultiValues(startKey: Option[UnsafeRow], endKey: Option[UnsafeRow], colFamilyName: String)
      : StateStoreIterator[UnsafeRowPair] = throw StoreChecks.noRangeScan(storeProvider)

  /** One family, Spark's default: column families come in a later release. */
  override def allColumnFamilyNames: Set[String] = Set(StateStore.DEFAULT_COL_FAMILY_NAME)
}

/** Spark 4.2's `StateStore.deleteRange`: a range-scan operation, refused like `rangeScan`. */
trait WriteStoreSince42 extends StateStore with ReadStoreSince42 {
  override def deleteRange(beginKey: UnsafeRow, endKey: UnsafeRow, colFamilyName: String): Unit =
    throw StoreChecks.noRangeScan(storeProvider)
}
