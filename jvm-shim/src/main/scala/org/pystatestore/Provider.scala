package org.pystatestore

import java.io.File
import java.util.UUID

import scala.collection.mutable
import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.json4s._
import org.json4s.jackson.JsonMethods.{compact, render}

import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.execution.streaming.state.pystatestore.{ChangeFeedSupport, SparkInternals}
import org.apache.spark.sql.types.StructType

/**
 * The shared core of Spark's entry point to pystatestore; `PythonStateStoreProvider`, in the
 * adapter of each Spark minor (jvm-shim/src/spark-*), adds only what differs between minors.
 * Thin by design (DESIGN §2): the running version's writes stay in a buffer and committed versions
 * are read in this JVM (from the read-only RocksDB view the worker leaves on local disk, or, for
 * the memory backend, from a heap near-cache), so per-row
 * calls never leave the JVM; loads, commits and maintenance go to the per-JVM Python worker, which
 * owns durability. The versions it keeps and loads are StoreVersions'; its calls go through its
 * StoreSession, the store's handle in that worker.
 */
abstract class PythonStateStoreProviderCore extends StateStoreProvider with ChangeFeedSupport with Logging {
  import ProviderCore._
  import ProviderMetrics._
  import WorkerReplies._

  // A jar of another minor must say which jar to use before anything else can fail less clearly:
  // Spark asks a provider it has only constructed for its metrics, and the ProviderMetrics object that
  // holds them already links against this minor's Spark, so the check is the constructor's first
  // act and names nothing from that object.
  locally {
    val runningMinor = org.apache.spark.SPARK_VERSION.split('.').take(2).mkString(".")
    if (runningMinor != builtForSparkMinor) {
      throw new IllegalStateException(s"PythonStateStoreProvider: this pystatestore shim jar is built for Spark " +
        s"$builtForSparkMinor, but this JVM runs Spark ${org.apache.spark.SPARK_VERSION}. Put " +
        s"pystatestore-shim-spark$runningMinor.jar on the classpath instead: pystatestore.jar_path() and " +
        "pystatestore.configure_spark() pick the jar of the running pyspark.")
    }
  }

  @volatile private var storeIdValue: StateStoreId = _
  private var keySchema: StructType = _
  private var valueSchema: StructType = _
  private var prefixSpec: Option[PrefixKeySpec] = None
  private var storeConf: StateStoreConf = _
  private var hadoopConf: Configuration = _
  private var launchSpec: WorkerLaunchSpec = _
  private var storeLocation: String = _

  @volatile private var hasCommitted = false
  private var counted = false

  /** Where Spark's state store coordinator tracks this store (None outside a running query). */
  private var coordinatorId: Option[StateStoreProviderId] = None
  /** The newest version this store made a snapshot of (-1: none yet), as told to the coordinator. */
  private val lastSnapshot = new java.util.concurrent.atomic.AtomicLong(-1L)
  /** Snapshots made since the last commit's metrics took the count. */
  private val snapshotsSinceCommit = new java.util.concurrent.atomic.AtomicLong(0L)
  /** A snapshot asked for by a commit is waiting or running (at most one per store). */
  private val snapshotRequested = new java.util.concurrent.atomic.AtomicBoolean(false)
  @volatile private var closed = false
  /** Spark's coordinator judges a store lagging once its snapshots trail by more versions than this. */
  private var laggingAfterVersions = Long.MaxValue

  /** The store's session with its worker, and its committed versions: both made by `init`. */
  private var session: StoreSession = _
  private var versions: StoreVersions = _
  /** Read committed versions through RocksDB views (rocksdb backend) or from the heap (memory). */
  private var usesViews = true
  private var keyCodec: KeyCodec = _
  @volatile private var columnFamiliesValue = false
  @volatile private var checkpointIdsValue = false
  private val familySpecs = new java.util.concurrent.ConcurrentHashMap[String, FamilySpec]()
  private var bufferCodec: KeyCodec = _
  /** Stores handed out and not yet released: the provider releases them when it closes. */
  private val liveStores = new java.util.LinkedHashSet[StoreResources]()

  override def init(
      stateStoreId: StateStoreId,
      keySchema: StructType,
      valueSchema: StructType,
      keyStateEncoderSpec: KeyStateEncoderSpec,
      useColumnFamilies: Boolean,
      storeConfs: StateStoreConf,
      hadoopConf: Configuration,
      useMultipleValuesPerKey: Boolean,
      stateSchemaProvider: Option[StateSchemaProvider]): Unit = {
    this.storeIdValue = stateStoreId
    if (!counted) { counted = true; RocksViews.providerOpened() }
    this.keySchema = keySchema
    this.valueSchema = valueSchema
    this.storeConf = storeConfs
    this.hadoopConf = hadoopConf
    launchSpec = WorkerLaunchSpec.resolve(storeConfs.sqlConfs)
    usesViews = ProviderConf.usesViews(storeConfs)
    StoreChecks.layoutSupported(stateStoreId, useColumnFamilies, useMultipleValuesPerKey, usesViews,
      storeConfs.stateStoreEncodingFormat)
    columnFamiliesValue = useColumnFamilies
    checkpointIdsValue = storeConfs.enableStateStoreCheckpointIds
    prefixSpec = if (useColumnFamilies) None // each family has its own key encoder
      else StoreChecks.keyEncoderPrefix(stateStoreId, keySchema, keyStateEncoderSpec)
    if (useColumnFamilies) {
      declareFamily(FamilySpec(StateStore.DEFAULT_COL_FAMILY_NAME, keySchema, valueSchema, keyStateEncoderSpec,
        useMultipleValuesPerKey))
    }
    // The write buffer always puts the prefix first (a prefix is a byte prefix of its keys); what
    // is stored does so only where the backend reads through views.
    bufferCodec = prefixSpec match {
      case Some(spec) => new PrefixKeys(spec, keySchema.length)
      case None => new RawKeys(keySchema.length)
    }
    keyCodec = if (usesViews) bufferCodec else new RawKeys(keySchema.length)
    if (usesViews) RocksViews.configure(ProviderConf.jvmBlockCacheMB(storeConfs))
    val location = stateStoreId.storeCheckpointLocation()
    storeLocation = location.getFileSystem(hadoopConf).makeQualified(location).toString
    coordinatorId = if (storeConfs.reportSnapshotUploadLag) SparkInternals.providerId(stateStoreId, hadoopConf) else None
    laggingAfterVersions = ProviderConf.laggingAfterVersions(storeConfs)
    workerOptions = ProviderConf.workerOptions(storeConfs)
    session = new StoreSession(launchSpec, stateStoreId.partitionId, describeStore, () => describeForWorker(),
      StoreChecks.readPathMatches(_, usesViews, this))
    versions = new StoreVersions(session, keyCodec, usesViews, prefixSpec, keySchema.length, valueSchema.length,
      ProviderConf.versionsInMemory(storeConfs), describeStore)
    // In a task, the store's first call will need its worker: start it while the task reads its
    // input. Elsewhere (a provider Spark only inspects) no worker is started before it is needed.
    if (org.apache.spark.TaskContext.get() != null) StateWorker.prestart(launchSpec, stateStoreId.partitionId)
  }

  private var workerOptions: List[(String, JValue)] = Nil

  /** What the worker needs to open this store; each call makes a new provider-instance id. */
  private def describeForWorker(): String = {
    val stateStoreId = storeIdValue
    compact(render(JObject(
      "storeDir" -> JString(storeLocation),
      // Worker-side state is per provider instance: a restarted query never sees a cache filled
      // by an earlier run, even in the same JVM, and always reloads from the checkpoint.
      "instanceId" -> JString(UUID.randomUUID().toString),
      "operatorId" -> JLong(stateStoreId.operatorId),
      "partitionId" -> JInt(stateStoreId.partitionId),
      "storeName" -> JString(stateStoreId.storeName),
      "keySchema" -> JString(keySchema.json),
      "valueSchema" -> JString(valueSchema.json),
      "minVersionsToRetain" -> JInt(storeConf.minVersionsToRetain),
      "minDeltasForSnapshot" -> JInt(storeConf.minDeltasForSnapshot),
      "viewsDir" -> JString(StateWorker.viewsDir.getAbsolutePath),
      "hostDir" -> JString(StateWorker.hostDir.getAbsolutePath),
      "keyEncoding" -> JString(if (columnFamilies) KeyCodec.Families else keyCodec.name),
      "checkpointIds" -> JBool(checkpointIds),
      "options" -> JObject(workerOptions))))
  }

  override def stateStoreId: StateStoreId = storeIdValue

  // ---- what each Spark minor's adapter builds its signatures from ----

  /** The Spark minor ("4.3") the adapter compiled into this jar is for. */
  protected def builtForSparkMinor: String

  // The stores are `PythonReadStateStore` and `PythonStateStore`, which each minor's adapter
  // defines (with that minor's ReadStateStore additions) over the core stores below: a write store
  // is `loaded` plus `readMarks` (null: a fresh buffer); with `forceSnapshot` its commit also makes
  // the new version's snapshot before returning.

  /** The write store for `version` (Spark's getStore, whatever its signature in this minor). */
  protected def openWriteStore(version: Long, stateStoreCkptId: Option[String], forceSnapshot: Boolean): StateStore =
    new PythonStateStore(this, loadForTask(version, stateStoreCkptId), null, forceSnapshot)

  override def getReadStore(version: Long, uniqueId: Option[String]): ReadStateStore =
    new PythonReadStateStore(this, loadForTask(version, uniqueId))

  /** Reuses the read store's loaded version: no second load, and no lock to wait on. */
  protected def upgradeToWriteStore(
      readStore: ReadStateStore,
      version: Long,
      uniqueId: Option[String],
      forceSnapshot: Boolean): StateStore = readStore match {
    case r: PythonReadStateStoreCore
        if r.version == version && r.id == stateStoreId && StoreVersions.isAttempt(r.base.state, uniqueId) =>
      r.base.state.retain() // the write store holds its own reference
      new PythonStateStore(this, r.base, r.handOverReadMarks(), forceSnapshot)
    case _ => openWriteStore(version, uniqueId, forceSnapshot)
  }

  /**
   * An empty write store at `version` whose commit writes `version + 1` as a whole state that needs
   * no earlier version (Spark 4.2's `loadEmpty`; on every minor, `pystatestore migrate` and
   * `repartition` write a store's state this way). Nothing of `version` is loaded: it may not exist.
   */
  private[pystatestore] def openEmptyWriteStore(version: Long, forceSnapshot: Boolean): StateStore = {
    if (version < 0) throw SparkInternals.unexpectedStateStoreVersion(version)
    new PythonStateStore(this, LoadedVersion(versions.empty(version), LoadMetrics.fromCache), null, forceSnapshot)
  }

  /**
   * `endVersion` rebuilt from the snapshot of `snapshotVersion` and the changes after it, skipping
   * every later snapshot and local copy (the state data source's snapshotStartBatchId). The version
   * is not cached: it is what a damaged later snapshot would otherwise hide.
   */
  override def replayStateFromSnapshot(
      snapshotVersion: Long,
      endVersion: Long,
      readOnly: Boolean,
      snapshotVersionStateStoreCkptId: Option[String],
      endVersionStateStoreCkptId: Option[String]): StateStore = {
    try {
      StoreChecks.replayRange(snapshotVersion, endVersion, this)
      if (!usesViews) throw StoreChecks.noReplayOnMemoryBackend(this)
      new PythonStateStore(this,
        versions.replay(snapshotVersion, snapshotVersionStateStoreCkptId, endVersion, endVersionStateStoreCkptId),
        null, forceSnapshot = false)
    } catch {
      case NonFatal(e) => throw SparkInternals.cannotLoadStore(e)
    }
  }

  /**
   * The changes of versions `startVersion` to `endVersion` as Spark's change feed rows (batch id =
   * version - 1; deletes carry a null value), read lazily from a frame the worker writes.
   */
  override protected def changeRows(
      startVersion: Long,
      endVersion: Long,
      colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String]): (Iterator[(Boolean, UnsafeRow, UnsafeRow, Long)], () => Unit) = {
    if (!columnFamilies) colFamilyNameOpt.foreach(StoreChecks.defaultFamily(_, this))
    // A store with column families: the rows of one family, found by its id in the end version's registry.
    val family: Option[(FamilySpec, FamilyKeys)] = if (!columnFamilies) None else {
      val name = colFamilyNameOpt.getOrElse(StateStore.DEFAULT_COL_FAMILY_NAME)
      val spec = familySpec(name).getOrElse(
        throw SparkInternals.missingColumnFamily("readChangeFeed", s"$name (store $describeStore)"))
      val end = loadForTask(endVersion, endVersionStateStoreCkptId).state
      val id = try FamilyRegistry.read(end)._1.get(name).map(_._1) finally end.release()
      // A family the end version does not have gets an id never given (ids stop below 0xffff, and a
      // removed family's id is never given again): it has no rows.
      Some(spec -> spec.codec(id.getOrElse(0xffff)))
    }
    val worker = session.worker()
    val file = new File(worker.exchangeDir, s"changes-${UUID.randomUUID()}.arrow")
    try {
      session.call(worker, s"change feed of $describeStore, versions $startVersion to $endVersion") { (svc, h) =>
        svc.changes(h, startVersion, endVersion, endVersionStateStoreCkptId.getOrElse(""), file.getAbsolutePath)
      }
      val reader = new ArrowFrames.ChangeFeedReader(file)
      val rows = family match {
        case None => reader.map { r =>
          val value = if (r.value == null) null else toRow(r.value, numValueFields)
          (r.op == ArrowFrames.OpPut, keyCodec.decode(r.key), value, r.version - 1)
        }
        case Some((spec, codec)) =>
          val valueFields = spec.valueSchema.length
          reader.filter(r => WriteBuffer.startsWith(r.key, codec.familyPrefix)).flatMap { r =>
            val key = codec.decode(r.key)
            val isPut = r.op == ArrowFrames.OpPut
            if (r.value == null) Iterator((isPut, key, null, r.version - 1))
            else if (!spec.multipleValues) Iterator((isPut, key, toRow(r.value, valueFields), r.version - 1))
            else ValueLists.decode(toRow(r.value, 1), valueFields).map(v => (isPut, key, v, r.version - 1))
          }
      }
      (rows, () => try reader.close() finally file.delete())
    } catch {
      case NonFatal(e) =>
        file.delete()
        throw e
    }
  }

  /** Tracks a store's resources; released at the latest when its task ends or the provider closes. */
  private[pystatestore] def track(store: StoreResources): Unit = {
    synchronized { liveStores.add(store) }
    Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit](_ => store.releaseResources()))
  }

  private[pystatestore] def untrack(store: StoreResources): Unit = synchronized { liveStores.remove(store) }

  /** Both parts of maintenance: Spark before 4.3 calls only this, 4.3 on unload. */
  override def doMaintenance(): Unit = maintain(MaintainSnapshot, MaintainCleanup)

  /**
   * Maintenance in the worker: `MaintainSnapshot` makes a due snapshot of a changelog chain,
   * `MaintainCleanup` applies retention and collects garbage.
   */
  protected def maintain(parts: String*): Unit = {
    // Only a provider that has written may delete: one opened just to read (e.g. the state data
    // source) never changes the checkpoint, even if a maintenance thread reaches it.
    if (!hasCommitted) return
    val what = parts.mkString(",")
    try {
      val reply = session.call(s"maintenance ($what) of store $describeStore")(_.maintenance(_, what))
      versionField(reply, "materializedVersion").foreach(snapshotMade)
      logDebug(s"Maintenance ($what) of $describeStore: ${compact(render(reply))}")
    } catch {
      case NonFatal(e) => logWarning(s"Maintenance ($what) of $describeStore failed; will retry", e)
    }
  }

  override def close(): Unit = {
    closed = true
    val (cached, stores) = synchronized {
      val c = versions.takeAll()
      val s = liveStores.asScala.toList
      liveStores.clear()
      (c, s)
    }
    // The worker closes the store once the work a durable-first commit left is done, so the view
    // directories that work writes are deleted below only after it has.
    try session.close()
    catch { case NonFatal(e) => logDebug(s"Ignoring close failure: $e") }
    stores.foreach(_.releaseResources())
    cached.foreach(_.release())
    if (counted) { counted = false; RocksViews.providerClosed() }
  }

  override def supportedCustomMetrics: Seq[StateStoreCustomMetric] = AllCustomMetrics

  /** Spark's own per-store metric of the newest snapshot version, as its built-in providers report it. */
  override def supportedInstanceMetrics: Seq[StateStoreInstanceMetric] = Seq(SparkInternals.snapshotLastUploaded)

  /**
   * `version` of this store is now a snapshot (a snapshot commit, one Spark forced, or one maintenance
   * made): counted for the metrics and reported to Spark's coordinator, which otherwise judges the
   * store lagging and forces a snapshot on every commit (Spark 4.2+).
   */
  private def snapshotMade(version: Long): Unit = {
    snapshotsSinceCommit.incrementAndGet()
    lastSnapshot.accumulateAndGet(version, math.max)
    coordinatorId.foreach(SnapshotReports.snapshotMade(_, version))
  }

  /** Makes the snapshot a commit made due, off the task's thread (see SnapshotRequests). */
  private def requestSnapshot(): Unit = if (!closed && snapshotRequested.compareAndSet(false, true)) {
    SnapshotRequests.submit { () =>
      try if (!closed) makeRequestedSnapshot()
      finally snapshotRequested.set(false)
    }
  }

  /** The snapshot maintenance a commit asked for; a minor whose maintenance has preconditions
   * (4.3: not on an unloaded provider) overrides this with them. */
  protected def makeRequestedSnapshot(): Unit = maintain(MaintainSnapshot)

  /** Spark's SnapshotLastUploaded instance metric of this store, for a store's metrics. */
  private[pystatestore] def instanceMetrics: Map[StateStoreInstanceMetric, Long] = Map(
    SparkInternals.snapshotLastUploaded.withNewId(storeIdValue.partitionId, storeIdValue.storeName) -> lastSnapshot.get)

  override def toString: String = s"$ProviderName[$describeStore]"

  // ---- internals used by the stores ----

  private[pystatestore] def describeStore: String =
    s"operator ${storeIdValue.operatorId}, partition ${storeIdValue.partitionId}, " +
      s"store '${storeIdValue.storeName}' at $storeLocation"

  private[pystatestore] def columnFamilies: Boolean = columnFamiliesValue

  /** Spark's checkpoint format v2: commits report their ids, and loads name the attempt they want. */
  private[pystatestore] def checkpointIds: Boolean = checkpointIdsValue

  /**
   * Families Spark declared to any store of this provider: the state reader declares a family on a
   * write store it then aborts and reads through a read store, so specs outlive stores. Ids are
   * not kept here: they are the checkpoint's, in each version's registry (FamilyRegistry).
   */
  private[pystatestore] def declareFamily(spec: FamilySpec): Unit = {
    if (spec.name.isEmpty || spec.name.length > 512) {
      throw new IllegalArgumentException(s"column family name of ${spec.name.length} characters in $describeStore")
    }
    spec.innerCodec // refuses an encoder or ordering column this store cannot lay out, before it is used
    familySpecs.put(spec.name, spec)
  }

  private[pystatestore] def familySpec(name: String): Option[FamilySpec] = Option(familySpecs.get(name))

  private[pystatestore] def numKeyFields: Int = keySchema.length
  private[pystatestore] def numValueFields: Int = valueSchema.length
  private[pystatestore] def prefix: Option[PrefixKeySpec] = prefixSpec
  private[pystatestore] def newWriteBuffer(): WriteBuffer = new WriteBuffer(bufferCodec, numValueFields)
  private[pystatestore] def scanPrefix(prefixKey: UnsafeRow): Array[Byte] = bufferCodec.scanPrefix(prefixKey)

  /**
   * Loads `version` for a task, holding one reference to it for the caller; any failure becomes
   * Spark's CANNOT_LOAD_STATE_STORE.
   */
  private def loadForTask(version: Long, uniqueId: Option[String]): LoadedVersion = {
    try {
      if (version < 0) throw SparkInternals.unexpectedStateStoreVersion(version)
      versions.load(version, uniqueId)
    } catch {
      case NonFatal(e) => throw SparkInternals.cannotLoadStore(e)
    }
  }

  /**
   * Ships `buffer` to the worker as version `base.version + 1` and waits until it is durable.
   * Returns the new committed version (holding one reference for the caller) and the commit's
   * metrics. The key count is computed here, where Spark's reads showed which keys existed: the
   * worker never reads keys for bookkeeping.
   */
  private[pystatestore] def commitVersion(
      base: CommittedVersion,
      parts: Seq[CommitPart],
      forceSnapshot: Boolean): (CommittedVersion, Map[String, Long]) = {
    val started = System.nanoTime()
    val newVersion = base.version + 1
    // Only the heap near-cache needs the changes again after the frame is written.
    val heapBase = base match { case h: VersionState if !usesViews => Some(h); case _ => None }
    val puts = mutable.ArrayBuffer.empty[(UnsafeRow, UnsafeRow)]
    val deletes = mutable.ArrayBuffer.empty[UnsafeRow]
    var numKeys = base.numKeys
    var numInternalKeys = base.numInternalKeys
    var changedRows = 0L
    var lookedUp = 0L
    val worker = session.worker()
    val acquiredAt = System.nanoTime() // after a worker start, if this commit had to wait for one
    val file = new File(worker.exchangeDir, s"commit-${UUID.randomUUID()}.arrow")
    val viewDir = new File(StateWorker.viewsDir, s"v$newVersion-${UUID.randomUUID()}")
    try {
      // One pass over the buffer: counts keys and streams the frame, copying rows straight from
      // the buffer's pages.
      val storedAsBuffered = keyCodec.name == bufferCodec.name
      val frameBytes = ArrowFrames.writeChanges(file) { out =>
        // Views' backend (rocksdb) writes the frame straight into a sorted SST file: sort it here.
        // Parts (column families) come in the order of their key prefixes.
        for (CommitPart(buffer, partBase, internal) <- parts) buffer.foreachWrite(sorted = usesViews) {
            (flags, page, keyAt, keyLength, valueAt, valueLength) =>
          def key = buffer.decodeKey(page, keyAt, keyLength)
          val present = WriteBuffer.presentInBase(flags) {
            lookedUp += 1
            partBase.contains(key)
          }
          val isDelete = WriteBuffer.isDelete(flags)
          if (!isDelete || present) { // deletes of absent keys are not sent
            val counted = if (isDelete) -1 else if (!present) 1 else 0
            numKeys += counted
            if (internal) numInternalKeys += counted
            changedRows += 1
            if (heapBase.isDefined) {
              if (isDelete) deletes += key.copy()
              else puts += (key.copy() -> buffer.decodeValue(page, valueAt, valueLength).copy())
            }
            if (storedAsBuffered) {
              if (isDelete) out.delete(page, keyAt, keyLength)
              else out.put(page, keyAt, keyLength, page, valueAt, valueLength)
            } else {
              val stored = keyCodec.encode(key)
              if (isDelete) out.delete(stored, 0, stored.length)
              else out.put(stored, 0, stored.length, page, valueAt, valueLength)
            }
          }
        }
      }
      val writtenAt = System.nanoTime()
      val reply = try {
        session.call(worker, s"commit of $describeStore version $newVersion") { (svc, h) =>
          svc.commit(h, base.version, base.manifestId, file.getAbsolutePath, attemptId(), numKeys, numInternalKeys,
            if (usesViews) viewDir.getAbsolutePath else "", forceSnapshot, emptyBase(base))
        }
      } catch {
        case e: StateWorkerException if e.errorType == "BaseVersionReplacedError" =>
          // Our cached base is an attempt the checkpoint no longer holds: forget it and what was
          // built on it, so the retried task loads the version the checkpoint has.
          versions.forgetFrom(base.version)
          StateWorker.deleteRecursively(viewDir)
          throw e
        case e: StateWorkerTimeoutException =>
          throw e // the worker may still be writing the view; it removes it if the commit fails
        case NonFatal(e) =>
          StateWorker.deleteRecursively(viewDir)
          throw e
      }
      val repliedAt = System.nanoTime()
      RocksViews.noteWorkerRss(worker.slot, longField(reply, "workerRssBytes"))
      versionField(reply, "snapshotVersion").foreach(snapshotMade)
      if (reply \ "snapshotDue" == JBool(true)) requestSnapshot()
      val state: CommittedVersion = heapBase match {
        case Some(heap) =>
          val prefixOf: UnsafeRow => UnsafeRow = prefixSpec match {
            case Some(spec) =>
              val proj = spec.newProjection()
              (k: UnsafeRow) => proj(k).copy()
            case None => _ => null
          }
          heap.applyChanges(newVersion, stringField(reply, "manifestId"), puts, deletes, prefixOf)
        case None =>
          val manifestId = stringField(reply, "manifestId")
          // Durable first: the worker replied once the version was durable and makes the view after.
          val awaitReady =
            if (reply \ "viewPending" == JBool(true)) versions.viewMadeAfterCommit(newVersion, manifestId, viewDir)
            else null
          new RocksView(viewDir, newVersion, manifestId, longField(reply, "numKeys"),
            longField(reply, "numInternalKeys"), keyCodec, numValueFields, describeStore, awaitReady)
      }
      state.retain() // one reference for the cache, one for the caller
      versions.remember(state)
      hasCommitted = true
      if (storeConf.commitValidationEnabled) {
        StateStore.reportCommitToCoordinator(newVersion, stateStoreId, hadoopConf)
      }
      val done = System.nanoTime()
      (state, replyMetrics(reply) ++ Map(
        MetricCommitMs -> (done - started) / 1000000,
        MetricWorkerStartMs -> (acquiredAt - started) / 1000000,
        MetricBridgeMs -> (writtenAt - acquiredAt) / 1000000,
        MetricWorkerCallMs -> (repliedAt - writtenAt) / 1000000,
        MetricAfterReplyMs -> (done - repliedAt) / 1000000,
        MetricChangedRows -> changedRows,
        MetricKeysLookedUp -> lookedUp,
        MetricFrameBytes -> frameBytes,
        MetricSnapshotsMade -> snapshotsSinceCommit.getAndSet(0L),
        MetricViewWaitMs -> versions.takeViewWaitMs(),
        MetricSnapshotsForced -> (if (forceSnapshot) 1L else 0L),
        MetricStoresLagging -> (if (newVersion - lastSnapshot.get > laggingAfterVersions) 1L else 0L)))
    } finally file.delete()
  }

  /**
   * An empty store opened at a version that was never loaded (`openEmptyWriteStore`): every loaded
   * or committed version after 0 carries the id of its manifest.
   */
  private def emptyBase(base: CommittedVersion): Boolean = base.version > 0 && base.manifestId.isEmpty

  private def attemptId(): String = Option(TaskContext.get()).map { tc =>
    s"stage${tc.stageId()}.${tc.stageAttemptNumber()}-task${tc.taskAttemptId()}.${tc.attemptNumber()}"
  }.getOrElse(s"driver-${UUID.randomUUID()}")
}

object ProviderCore {
  val ProviderName = "PythonStateStoreProvider"

  /** The parts of maintenance, as the worker names them. */
  val MaintainSnapshot = "snapshot"
  val MaintainCleanup = "cleanup"
}
