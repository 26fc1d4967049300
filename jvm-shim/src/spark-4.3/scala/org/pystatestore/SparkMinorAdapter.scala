package org.pystatestore

import org.apache.spark.sql.execution.streaming.state.KeyStateEncoderSpec
import org.apache.spark.sql.types.StructType

/**
 * Spark 4.3 over the shared core: 4.2's signatures and store additions (ProviderSince42,
 * ReadStoreSince42), plus split maintenance and registerColFamily. Spark 4.3's maintenance threads call only
 * `doSnapshotMaintenance` and `doCleanupMaintenance`, each under `maintenanceLock`'s read lock, and
 * close an unloaded provider under its write lock; `doMaintenance` (both parts) runs only on unload.
 */
class PythonStateStoreProvider extends PythonStateStoreProviderCore with ProviderSince42 {
  override protected def builtForSparkMinor: String = "4.3"

  /** An unloaded provider is closing (Spark holds or waits for the write lock): nothing to do. */
  override def doSnapshotMaintenance(): Unit = if (!unloaded) maintain(ProviderCore.MaintainSnapshot)

  override def doCleanupMaintenance(): Unit = if (!unloaded) maintain(ProviderCore.MaintainCleanup)

  /** A snapshot a commit asked for is snapshot maintenance too: under the same read lock, taken as
   * Spark's maintenance takes it (without waiting), so that it neither runs on an unloaded provider
   * nor overlaps Spark closing one. Skipped, it stays due: the next commit or maintenance makes it. */
  override protected def makeRequestedSnapshot(): Unit = {
    val lock = maintenanceLock.readLock()
    if (lock.tryLock()) {
      try doSnapshotMaintenance()
      finally lock.unlock()
    }
  }
}

class PythonReadStateStore private[pystatestore] (provider: PythonStateStoreProviderCore, loaded: LoadedVersion)
  extends PythonReadStateStoreCore(provider, loaded) with ReadStoreSince43

class PythonStateStore private[pystatestore] (
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion,
    readMarks: WriteBuffer,
    forceSnapshot: Boolean)
  extends PythonStateStoreCore(provider, loaded, readMarks, forceSnapshot) with WriteStoreSince42 with ReadStoreSince43

/**
 * Spark 4.3's `registerColFamily` on a read store: declares the family to a store with column
 * families; other stores have only Spark's default one.
 */
trait ReadStoreSince43 extends ReadStoreSince42 {
  override def registerColFamily(
      colFamilyName: String,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useMultipleValuesPerKey: Boolean,
      isInternal: Boolean): Unit =
    if (storeProvider.columnFamilies) {
      storeProvider.declareFamily(
        FamilySpec(colFamilyName, keySchema, valueSchema, keyStateEncoderSpec, useMultipleValuesPerKey))
    } else StoreChecks.defaultFamily(colFamilyName, storeProvider)
}
