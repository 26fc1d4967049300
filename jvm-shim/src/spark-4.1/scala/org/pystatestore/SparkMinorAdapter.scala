package org.pystatestore

import org.apache.spark.sql.execution.streaming.state.{ReadStateStore, StateStore}

/**
 * Spark 4.1's signatures over the shared core: `getStore(version, uniqueId)` and the three-argument
 * `upgradeReadStoreToWriteStore`; maintenance is the core's `doMaintenance` (snapshot, then cleanup).
 */
class PythonStateStoreProvider extends PythonStateStoreProviderCore with ConstructibleOnLaterMinors {
  override protected def builtForSparkMinor: String = "4.1"

  override def getStore(version: Long, stateStoreCkptId: Option[String]): StateStore =
    openWriteStore(version, stateStoreCkptId, forceSnapshot = false)

  override def upgradeReadStoreToWriteStore(
      readStore: ReadStateStore,
      version: Long,
      uniqueId: Option[String]): StateStore =
    upgradeToWriteStore(readStore, version, uniqueId, forceSnapshot = false)
}

class PythonReadStateStore private[pystatestore] (provider: PythonStateStoreProviderCore, loaded: LoadedVersion)
  extends PythonReadStateStoreCore(provider, loaded)

class PythonStateStore private[pystatestore] (
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion,
    readMarks: WriteBuffer,
    forceSnapshot: Boolean) extends PythonStateStoreCore(provider, loaded, readMarks, forceSnapshot)
