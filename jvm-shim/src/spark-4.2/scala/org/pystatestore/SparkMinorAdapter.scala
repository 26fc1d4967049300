package org.pystatestore

import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore}

/**
 * Spark 4.2's signatures over the shared core: `getStore` with `forceSnapshotOnCommit` and
 * `loadEmpty`, `upgradeReadStoreToWriteStore` with `forceSnapshotOnCommit`, and the stores'
 * additions (ReadStoreSince42). Maintenance is the core's `doMaintenance` (snapshot, then cleanup).
 */
class PythonStateStoreProvider extends PythonStateStoreProviderCore with ConstructibleOnLaterMinors {
  override protected def builtForSparkMinor: String = "4.2"

  override def getStore(
      version: Long,
      stateStoreCkptId: Option[String],
      forceSnapshotOnCommit: Boolean,
      loadEmpty: Boolean): StateStore = {
    if (loadEmpty) refuseLoadEmpty(version)
    openWriteStore(version, stateStoreCkptId, forceSnapshotOnCommit)
  }

  override def upgradeReadStoreToWriteStore(
      readStore: ReadStateStore,
      version: Long,
      uniqueId: Option[String],
      forceSnapshotOnCommit: Boolean): StateStore =
    upgradeToWriteStore(readStore, version, uniqueId, forceSnapshotOnCommit)

  override protected def newReadStore(loaded: LoadedVersion): PythonReadStateStoreCore =
    new PythonReadStateStore(this, loaded)

  override protected def newWriteStore(
      loaded: LoadedVersion, readMarks: WriteBuffer, forceSnapshot: Boolean): PythonStateStoreCore =
    new PythonStateStore(this, loaded, readMarks, forceSnapshot)
}

class PythonReadStateStore private[pystatestore] (provider: PythonStateStoreProviderCore, loaded: LoadedVersion)
  extends PythonReadStateStoreCore(provider, loaded) with ReadStoreSince42 {
  override protected def storeProvider: PythonStateStoreProviderCore = provider
}

class PythonStateStore private[pystatestore] (
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion,
    readMarks: WriteBuffer,
    forceSnapshot: Boolean)
  extends PythonStateStoreCore(provider, loaded, readMarks, forceSnapshot) with WriteStoreSince42 {
  override protected def storeProvider: PythonStateStoreProviderCore = provider
}
