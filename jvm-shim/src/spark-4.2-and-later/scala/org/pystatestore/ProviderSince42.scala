package org.pystatestore

import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore}

/**
 * Spark 4.2's provider signatures, for 4.2 and 4.3 alike: `getStore` with `forceSnapshotOnCommit`
 * and `loadEmpty` (an empty store whose commit needs no earlier version), and
 * `upgradeReadStoreToWriteStore` with `forceSnapshotOnCommit`.
 */
trait ProviderSince42 extends PythonStateStoreProviderCore {
  override def getStore(
      version: Long,
      stateStoreCkptId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = {
    // An empty store loads nothing of `version`, so no attempt of it is named.
    if (loadEmpty) openEmptyWriteStore(version, forceSnapshotOnCommit)
    else openWriteStore(version, stateStoreCkptId, forceSnapshotOnCommit)
  }

  override def upgradeReadStoreToWriteStore(
      readStore: ReadStateStore,
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean): StateStore =
    upgradeToWriteStore(readStore, version, uniqueId, forceSnapshotOnCommit)
}
