package org.pystatestore

/**
 * Spark 4.2 over the shared core: 4.2's signatures (ProviderSince42) and the stores' additions
 * (ReadStoreSince42). Maintenance is the core's `doMaintenance` (snapshot, then cleanup).
 */
class PythonStateStoreProvider extends PythonStateStoreProviderCore with ConstructibleOnLaterMinors with ProviderSince42 {
  override protected def builtForSparkMinor: String = "4.2"
}

class PythonReadStateStore private[pystatestore] (provider: PythonStateStoreProviderCore, loaded: LoadedVersion)
  extends PythonReadStateStoreCore(provider, loaded) with ReadStoreSince42

class PythonStateStore private[pystatestore] (
    provider: PythonStateStoreProviderCore,
    loaded: LoadedVersion,
    readMarks: WriteBuffer,
    forceSnapshot: Boolean)
  extends PythonStateStoreCore(provider, loaded, readMarks, forceSnapshot) with WriteStoreSince42
