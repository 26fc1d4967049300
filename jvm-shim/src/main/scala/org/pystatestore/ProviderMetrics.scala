package org.pystatestore

import org.json4s._

import org.apache.spark.sql.execution.streaming.state._

/**
 * The provider's custom metrics, as Spark shows them for each store: their names, the ones the
 * worker's commit and load replies carry, and their descriptions.
 */
object ProviderMetrics {
  import WorkerReplies.longField

  val MetricCommitMs = "pystatestoreCommitMs"
  val MetricBridgeMs = "pystatestoreBridgeMs"
  val MetricWorkerStartMs = "pystatestoreWorkerStartMs"
  val MetricWorkerCommitMs = "pystatestoreWorkerCommitMs"
  val MetricWorkerCallMs = "pystatestoreWorkerCallMs"
  val MetricBytesWritten = "pystatestoreBytesWritten"
  val MetricChangedRows = "pystatestoreChangedRows"
  val MetricFrameBytes = "pystatestoreFrameBytes"
  val MetricLoadMs = "pystatestoreLoadMs"
  val MetricLoadsFromWorker = "pystatestoreLoadsFromWorker"
  val MetricLoadedBytes = "pystatestoreLoadedBytes"
  val MetricJvmBlockCacheBytes = "pystatestoreJvmBlockCacheBytes"
  val MetricKeysLookedUp = "pystatestoreKeysLookedUpAtCommit"
  val MetricWorkerRssBytes = "pystatestoreWorkerRssBytes"
  val MetricSnapshotsMade = "pystatestoreSnapshotsMade"
  val MetricSnapshotsForced = "pystatestoreSnapshotsForced"
  val MetricStoresLagging = "pystatestoreStoresLagging"
  val MetricViewWaitMs = "pystatestoreViewWaitMs"
  val MetricAfterReplyMs = "pystatestoreJvmAfterReplyMs"

  /** Commit metrics the worker reports in its reply: (metric name, reply field). */
  val WorkerReplyMetrics: Seq[(String, String)] = Seq(
    MetricWorkerCommitMs -> "commitMs",
    MetricBytesWritten -> "bytesWritten",
    "pystatestoreFilesUploaded" -> "filesUploaded",
    "pystatestoreFilesReused" -> "filesReused",
    "pystatestoreApplyMs" -> "applyMs",
    "pystatestoreFlushMs" -> "flushMs",
    "pystatestoreCheckpointMs" -> "checkpointMs",
    "pystatestoreUploadMs" -> "uploadMs",
    "pystatestoreManifestMs" -> "manifestMs",
    "pystatestoreLocalCopiesSaved" -> "localCopySaved",
    "pystatestoreDeferredApplyMs" -> "deferredApplyMs",
    "pystatestoreSegmentMs" -> "segmentMs",
    "pystatestoreApplyFailures" -> "applyFailures",
    "pystatestoreLocalCopyBytesCopied" -> "localCopyBytesCopied",
    "pystatestoreViewMs" -> "viewMs",
    "pystatestoreRestoreLocalFiles" -> "restoreLocalFiles",
    "pystatestoreRestoreLocalBytes" -> "restoreLocalBytes",
    "pystatestoreRestoreRemoteFiles" -> "restoreRemoteFiles",
    "pystatestoreRestoreRemoteBytes" -> "restoreRemoteBytes",
    "pystatestoreRestoreInlineBytes" -> "restoreInlineBytes",
    "pystatestoreRestoreMs" -> "restoreMs",
    "pystatestoreRestoreDownloadMs" -> "restoreDownloadMs",
    "pystatestoreRestoreIngestMs" -> "restoreIngestMs",
    "pystatestoreRestoreReplayMs" -> "restoreReplayMs",
    "pystatestoreRestoreOpenMs" -> "restoreOpenMs",
    "pystatestoreFilesInline" -> "filesInline",
    "pystatestoreRestoreChangelogVersions" -> "restoreChangelogVersions",
    "pystatestoreRestoreChangelogBytes" -> "restoreChangelogBytes")

  private[pystatestore] def replyMetrics(reply: JValue): Map[String, Long] =
    WorkerReplyMetrics.map { case (metric, field) => metric -> longField(reply, field) }.toMap

  val AllCustomMetrics: Seq[StateStoreCustomMetric] = Seq(
    StateStoreCustomTimingMetric(MetricCommitMs,
      "pystatestore: commit latency seen by the task (frame + worker)"),
    StateStoreCustomTimingMetric(MetricWorkerStartMs,
      "pystatestore: commit time waiting for a state worker to start (the JVM's first stores, or after a worker died)"),
    StateStoreCustomTimingMetric(MetricBridgeMs,
      "pystatestore: time to write the commit's Arrow frame in the JVM"),
    StateStoreCustomTimingMetric(MetricWorkerCommitMs,
      "pystatestore: time the Python worker took to make the version durable"),
    StateStoreCustomTimingMetric(MetricWorkerCallMs,
      "pystatestore: the commit's call to the worker as the JVM sees it (worker time + transport)"),
    StateStoreCustomSizeMetric(MetricBytesWritten,
      "pystatestore: bytes written to checkpoint storage by commits"),
    StateStoreCustomSumMetric(MetricChangedRows,
      "pystatestore: rows put or deleted by commits"),
    StateStoreCustomSizeMetric(MetricFrameBytes,
      "pystatestore: bytes of Arrow change frames sent to the worker"),
    StateStoreCustomTimingMetric(MetricLoadMs,
      "pystatestore: time to load versions missing from the near-cache"),
    StateStoreCustomSumMetric(MetricLoadsFromWorker,
      "pystatestore: versions loaded through the Python worker"),
    StateStoreCustomSizeMetric(MetricLoadedBytes,
      "pystatestore: bytes read from checkpoint storage by loads"),
    StateStoreCustomSumMetric("pystatestoreFilesUploaded", "pystatestore: files uploaded by commits"),
    StateStoreCustomSumMetric("pystatestoreFilesReused",
      "pystatestore: files reused from the base version by commits (not uploaded again)"),
    StateStoreCustomTimingMetric("pystatestoreApplyMs",
      "pystatestore: time applying changes (rocksdb: writing them as an SST file; after the reply when durable first)"),
    StateStoreCustomTimingMetric("pystatestoreFlushMs",
      "pystatestore: time making the changes part of the DB (rocksdb: ingesting the SST file; after the reply when " +
        "durable first)"),
    StateStoreCustomTimingMetric("pystatestoreCheckpointMs",
      "pystatestore: time taking the RocksDB checkpoint that is the read view (after the reply when durable first)"),
    StateStoreCustomTimingMetric("pystatestoreDeferredApplyMs",
      "pystatestore: worker time after durable-first commits replied: local DB, read view and local copy"),
    StateStoreCustomTimingMetric("pystatestoreSegmentMs",
      "pystatestore: commit time writing a durable-first commit's changes as a changelog segment"),
    StateStoreCustomSumMetric("pystatestoreApplyFailures",
      "pystatestore: durable-first commits whose local apply failed after the reply (the view was loaded instead)"),
    StateStoreCustomTimingMetric(MetricAfterReplyMs,
      "pystatestore: commit time in the JVM after the worker's reply (caching the version, Spark's coordinator)"),
    StateStoreCustomTimingMetric(MetricViewWaitMs,
      "pystatestore: time reads waited for the read views of durable-first commits"),
    StateStoreCustomTimingMetric("pystatestoreUploadMs", "pystatestore: commit time uploading files"),
    StateStoreCustomTimingMetric("pystatestoreManifestMs", "pystatestore: commit time writing the manifest"),
    StateStoreCustomSumMetric("pystatestoreLocalCopiesSaved",
      "pystatestore: versions kept as local recovery copies"),
    StateStoreCustomSizeMetric("pystatestoreLocalCopyBytesCopied",
      "pystatestore: bytes of local recovery copies copied, not hard-linked (another filesystem)"),
    StateStoreCustomTimingMetric("pystatestoreViewMs",
      "pystatestore: time the worker took to leave a loaded version as a read view"),
    StateStoreCustomSumMetric(MetricKeysLookedUp,
      "pystatestore: written keys whose presence in the base version the commit had to look up (not read before)"),
    StateStoreCustomSizeMetric(MetricJvmBlockCacheBytes,
      "pystatestore: this store's share of the JVM's RocksDB block cache in use (read views)"),
    StateStoreCustomSizeMetric(MetricWorkerRssBytes,
      "pystatestore: this store's share of the Python worker's resident memory"),
    StateStoreCustomSumMetric("pystatestoreRestoreLocalFiles",
      "pystatestore: files restored from local recovery copies"),
    StateStoreCustomSizeMetric("pystatestoreRestoreLocalBytes",
      "pystatestore: bytes restored from local recovery copies"),
    StateStoreCustomSumMetric("pystatestoreRestoreRemoteFiles",
      "pystatestore: files restored from checkpoint storage"),
    StateStoreCustomSizeMetric("pystatestoreRestoreRemoteBytes",
      "pystatestore: bytes of files restored from checkpoint storage"),
    StateStoreCustomSizeMetric("pystatestoreRestoreInlineBytes",
      "pystatestore: bytes of changes read from inside manifests, which come from checkpoint storage"),
    StateStoreCustomTimingMetric("pystatestoreRestoreMs", "pystatestore: time rebuilding local state"),
    StateStoreCustomTimingMetric("pystatestoreRestoreDownloadMs",
      "pystatestore: of the restore time, waiting for files from the checkpoint"),
    StateStoreCustomTimingMetric("pystatestoreRestoreIngestMs",
      "pystatestore: of the restore time, writing a compact snapshot's state into the database"),
    StateStoreCustomTimingMetric("pystatestoreRestoreReplayMs",
      "pystatestore: of the restore time, replaying changelog versions"),
    StateStoreCustomTimingMetric("pystatestoreRestoreOpenMs",
      "pystatestore: of the restore time, opening restored databases"),
    StateStoreCustomSumMetric("pystatestoreFilesInline",
      "pystatestore: small files stored inside manifests rather than as files of their own"),
    StateStoreCustomSumMetric("pystatestoreRestoreChangelogVersions",
      "pystatestore: changelog versions replayed on top of a snapshot to rebuild local state"),
    StateStoreCustomSizeMetric("pystatestoreRestoreChangelogBytes",
      "pystatestore: bytes of changelog replayed to rebuild local state"),
    StateStoreCustomSumMetric(MetricSnapshotsMade,
      "pystatestore: snapshots made (snapshot commits, forced, and by maintenance), each reported to Spark's coordinator"),
    StateStoreCustomSumMetric(MetricSnapshotsForced,
      "pystatestore: commits Spark asked to be snapshots (forceSnapshotOnCommit: the store was judged lagging)"),
    StateStoreCustomSumMetric(MetricStoresLagging,
      "pystatestore: stores whose newest snapshot reported to Spark's coordinator trails the committed version " +
        "by more than Spark's lag rule (multiplierForMinVersionDiffToLog x minDeltasForSnapshot versions)"))

  private[pystatestore] def metricsMap(values: Map[String, Long]): Map[StateStoreCustomMetric, Long] =
    AllCustomMetrics.map(m => m -> values.getOrElse(m.name, 0L)).toMap
}
