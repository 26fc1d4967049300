package org.pystatestore

import org.json4s._

import org.apache.spark.sql.execution.streaming.state.StateStoreConf

/**
 * The provider's confs, read when a store is opened: Spark's state store confs and pystatestore's
 * own (under WorkerLaunchSpec.ConfPrefix; those that start the worker are WorkerLaunchSpec's).
 */
private[pystatestore] object ProviderConf {
  /** Committed versions the provider keeps open (at least one). */
  def versionsInMemory(storeConfs: StateStoreConf): Int = math.max(1, storeConfs.maxVersionsToRetainInMemory)

  /** Committed versions are read through RocksDB views (rocksdb backend), else from the heap (memory). */
  def usesViews(storeConfs: StateStoreConf): Boolean =
    storeConfs.sqlConfs.getOrElse(WorkerLaunchSpec.ConfPrefix + "backend", "rocksdb") != "memory"

  /** The JVM's RocksDB block cache for read views, in MiB; a value that is not a positive number is refused. */
  def jvmBlockCacheMB(storeConfs: StateStoreConf): Long =
    storeConfs.sqlConfs.get(WorkerLaunchSpec.ConfPrefix + "jvmBlockCacheMB")
      .map(v => scala.util.Try(v.trim.toLong).toOption.filter(_ > 0).getOrElse(throw new IllegalArgumentException(
        s"${WorkerLaunchSpec.ConfPrefix}jvmBlockCacheMB=$v is not a positive number of MiB; fix or unset it")))
      .getOrElse(RocksViews.DefaultBlockCacheMB)

  /** Spark's coordinator judges a store lagging once its snapshots trail by more versions than this. */
  def laggingAfterVersions(storeConfs: StateStoreConf): Long =
    storeConfs.minDeltasForSnapshot.toLong * storeConfs.sqlConfs
      .get("spark.sql.streaming.stateStore.multiplierForMinVersionDiffToLog").flatMap(_.trim.toLongOption).getOrElse(5L)

  /** pystatestore's confs, without their prefix: the options the worker opens the store with. */
  def workerOptions(storeConfs: StateStoreConf): List[(String, JValue)] =
    storeConfs.sqlConfs.collect {
      case (k, v) if k.startsWith(WorkerLaunchSpec.ConfPrefix) =>
        k.stripPrefix(WorkerLaunchSpec.ConfPrefix) -> JString(v)
    }.toList
}
