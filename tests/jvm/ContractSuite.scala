package org.pystatestore.tests

import java.io.File
import java.nio.file.{Files, Path}
import java.util.UUID
import java.util.concurrent.{Callable, Executors, TimeUnit}

import scala.collection.mutable
import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration

import org.apache.spark.SparkThrowable
import org.apache.spark.sql.SparkSession
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

import org.pystatestore.{PythonStateStoreProvider, Release, StateWorker}

/**
 * The provider contract, driven directly in a JVM (DESIGN §7), after Spark's StateStoreSuiteBase
 * scenarios. Run by tests/test_contract.py through spark-submit; prints one line per scenario:
 * "PASS name 123ms" or "FAIL name 123ms: reason", with the time the scenario took. Arguments: work
 * dir, python executable, python path.
 */
object ContractSuite {
  val keySchema: StructType = StructType(Seq(StructField("k", StringType), StructField("i", IntegerType)))
  val valueSchema: StructType = StructType(Seq(StructField("v", IntegerType)))
  private val keyProj = UnsafeProjection.create(keySchema)
  private val valueProj = UnsafeProjection.create(valueSchema)
  private val prefixProj = UnsafeProjection.create(StructType(Seq(StructField("k", StringType))))

  private var workDir: Path = _
  private var pythonExec: String = _
  private var pythonPath: String = _
  private var backend: String = "rocksdb"
  /** The rocksdb backend's commit mode ("" leaves the default). */
  private var commitMode: String = ""
  /** Whether versions are committed as changelogs (the rocksdb backend's default mode). */
  def changelogCommits: Boolean = backend == "rocksdb" && commitMode != "snapshot"

  // Projections reuse one output buffer and are not thread-safe; scenarios use several threads.
  def key(s: String, i: Int = 0): UnsafeRow =
    keyProj.synchronized { keyProj(InternalRow(UTF8String.fromString(s), i)).copy() }
  def value(v: Int): UnsafeRow = valueProj.synchronized { valueProj(InternalRow(v)).copy() }
  def prefix(s: String): UnsafeRow =
    prefixProj.synchronized { prefixProj(InternalRow(UTF8String.fromString(s))).copy() }
  def intOf(row: UnsafeRow): Option[Int] = Option(row).map(_.getInt(0))

  final class Check(msg: String) extends Exception(msg)
  def check(cond: Boolean, msg: => String): Unit = if (!cond) throw new Check(msg)
  def expectThrows[T <: Throwable](what: String)(body: => Any)(implicit ct: scala.reflect.ClassTag[T]): T = {
    try {
      body
    } catch {
      case e: Throwable if ct.runtimeClass.isInstance(e) => return e.asInstanceOf[T]
      case e: Throwable => throw new Check(s"$what: expected ${ct.runtimeClass.getSimpleName}, got $e")
    }
    throw new Check(s"$what: expected ${ct.runtimeClass.getSimpleName}, nothing was thrown")
  }
  /** Waits up to 60 s for `cond`, or until `over` (the awaited work ended without it); returns `cond`. */
  def awaitCondition(cond: => Boolean, over: => Boolean): Boolean = {
    val deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(60)
    while (!cond && !over && System.nanoTime() < deadline) Thread.sleep(20)
    cond
  }
  def messages(e: Throwable): String =
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null).map(t => String.valueOf(t.getMessage)).mkString(" <- ")

  def newDir(): String = Files.createTempDirectory(workDir, "store").toUri.toString

  def sqlConf(extra: (String, String)*): SQLConf = {
    val c = new SQLConf()
    c.setConfString("spark.sql.streaming.stateStore.pystatestore.pythonExec", pythonExec)
    c.setConfString("spark.sql.streaming.stateStore.pystatestore.pythonPath", pythonPath)
    c.setConfString("spark.sql.streaming.stateStore.pystatestore.backend", backend)
    if (commitMode.nonEmpty) c.setConfString("spark.sql.streaming.stateStore.pystatestore.commitMode", commitMode)
    extra.foreach { case (k, v) => c.setConfString(k, v) }
    c
  }

  def provider(
      root: String,
      partition: Int = 0,
      encoder: KeyStateEncoderSpec = NoPrefixKeyStateEncoderSpec(keySchema),
      conf: SQLConf = sqlConf(),
      useColumnFamilies: Boolean = false): PythonStateStoreProvider = {
    val p = new PythonStateStoreProvider()
    p.init(StateStoreId(root, 0, partition), keySchema, valueSchema, encoder, useColumnFamilies,
      new StateStoreConf(conf), new Configuration(), false, None)
    p
  }

  def contents(store: ReadStateStore): Map[(String, Int), Int] =
    store.iterator().map(p => (p.key.getUTF8String(0).toString, p.key.getInt(1)) -> p.value.getInt(0)).toMap

  def commitVersion(p: StateStoreProvider, base: Long, puts: Map[String, Int], removes: Seq[String] = Nil): Long = {
    val s = p.getStore(base)
    puts.foreach { case (k, v) => s.put(key(k), value(v)) }
    removes.foreach(k => s.remove(key(k)))
    try s.commit() finally s.release() // what the end of a Spark task does
  }

  private val scenarios = mutable.LinkedHashMap.empty[String, () => Unit]
  def scenario(name: String)(body: => Unit): Unit = scenarios(name) = () => body

  scenario("get_put_remove_commit") {
    val p = provider(newDir())
    val s = p.getStore(0)
    check(s.version == 0, s"version ${s.version}")
    check(s.get(key("a")) == null, "empty store returned a value")
    s.put(key("a"), value(1)); s.put(key("b"), value(2)); s.put(key("a"), value(3))
    check(intOf(s.get(key("a"))).contains(3), "latest put wins")
    s.remove(key("b"))
    check(s.get(key("b")) == null, "removed key still visible")
    check(s.metrics.numKeys == 1, s"numKeys before commit ${s.metrics.numKeys}")
    check(s.commit() == 1, "commit returns the new version")
    check(s.hasCommitted, "hasCommitted")
    val s1 = p.getStore(1)
    check(contents(s1) == Map(("a", 0) -> 3), s"version 1: ${contents(s1)}")
    s1.abort()
    p.close()
  }

  scenario("updates_after_commit_or_abort_are_refused") {
    val p = provider(newDir())
    val s = p.getStore(0)
    s.put(key("a"), value(1)); s.commit()
    expectThrows[IllegalStateException]("put after commit")(s.put(key("b"), value(2)))
    expectThrows[IllegalStateException]("commit twice")(s.commit())
    s.abort() // abort after commit is harmless
    val s2 = p.getStore(1)
    s2.abort()
    expectThrows[IllegalStateException]("remove after abort")(s2.remove(key("a")))
    p.close()
  }

  scenario("put_null_is_refused") {
    val p = provider(newDir())
    val s = p.getStore(0)
    expectThrows[IllegalArgumentException]("put(null)")(s.put(key("a"), null))
    s.abort(); p.close()
  }

  scenario("iterator_sees_buffer_and_base_and_allows_updates") {
    val p = provider(newDir())
    commitVersion(p, 0, Map("a" -> 1, "b" -> 2, "c" -> 3))
    val s = p.getStore(1)
    s.put(key("d"), value(4)); s.put(key("a"), value(10)); s.remove(key("c"))
    check(contents(s) == Map(("a", 0) -> 10, ("b", 0) -> 2, ("d", 0) -> 4), s"merged view ${contents(s)}")
    val it = s.iterator()
    var seen = 0
    while (it.hasNext) { val pair = it.next(); s.remove(pair.key); s.put(key("new" + seen), value(seen)); seen += 1 }
    check(seen == 3, s"iterated $seen rows")
    check(contents(s).keySet.forall(_._1.startsWith("new")), s"after removing while iterating: ${contents(s)}")
    s.commit(); p.close()
  }

  scenario("write_buffer_matches_a_map_across_pages_overwrites_and_point_in_time_scans") {
    // Enough writes to fill many buffer pages and grow its index, rows larger than a page,
    // overwrites, deletes of present and absent keys, and iterators and prefix scans that must
    // see the store as it was when they started while it keeps changing.
    val dir = newDir()
    val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
    val p = provider(dir, encoder = spec)
    val rnd = new scala.util.Random(7)
    val prefixes = (0 until 30).map(i => s"p$i")
    def randomKey(): (String, Int) = (prefixes(rnd.nextInt(prefixes.size)), rnd.nextInt(1500))
    var model = (1 to 3000).map(_ => randomKey() -> rnd.nextInt(1000)).toMap
    val first = p.getStore(0)
    model.foreach { case ((k, i), v) => first.put(key(k, i), value(v)) }
    first.commit(); first.release()
    def scanOf(st: ReadStateStore, pre: String): Map[(String, Int), Int] =
      st.prefixScan(prefix(pre)).map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
    val s = p.getStore(1)
    val big = "x" * (3 << 19) // a 1.5 MiB key: a record larger than a buffer page
    for (step <- 1 to 40000) {
      val k = if (step % 9000 == 0) (big + step, step) else randomKey()
      rnd.nextInt(10) match {
        case 0 | 1 =>
          s.remove(key(k._1, k._2)); model -= k
        case 2 | 3 =>
          check(intOf(s.get(key(k._1, k._2))) == model.get(k), s"get $k at step $step")
        case _ =>
          val v = rnd.nextInt(1000)
          s.put(key(k._1, k._2), value(v)); model += k -> v
      }
      if (step % 8000 == 0) {
        val pre = prefixes(rnd.nextInt(prefixes.size))
        val (all, scanned) = (s.iterator(), s.prefixScan(prefix(pre)))
        val (allThen, scanThen) = (model, model.filter(_._1._1 == pre))
        for (_ <- 1 to 2000) { // change the store while the scans are open
          val k2 = if (rnd.nextBoolean()) randomKey() else (pre, rnd.nextInt(1500))
          if (rnd.nextInt(3) == 0) { s.remove(key(k2._1, k2._2)); model -= k2 }
          else { val v = rnd.nextInt(1000); s.put(key(k2._1, k2._2), value(v)); model += k2 -> v }
        }
        val seen = all.map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
        check(seen == allThen, s"iterator at step $step: ${seen.size} rows, expected ${allThen.size}; " +
          s"differ on ${(seen.keySet ++ allThen.keySet).filter(x => seen.get(x) != allThen.get(x)).take(3)}")
        val seenScan = scanned.map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
        check(seenScan == scanThen, s"prefix scan of $pre at step $step: ${seenScan.size} rows, expected ${scanThen.size}")
      }
    }
    check(contents(s) == model, s"before commit: ${contents(s).size} rows, expected ${model.size}")
    check(s.metrics.numKeys == model.size, s"numKeys before commit ${s.metrics.numKeys}, expected ${model.size}")
    s.commit()
    check(s.metrics.numKeys == model.size, s"numKeys after commit ${s.metrics.numKeys}, expected ${model.size}")
    s.release(); p.close()
    val fresh = provider(dir, encoder = spec)
    val reloaded = fresh.getStore(2)
    check(contents(reloaded) == model, s"reloaded: ${contents(reloaded).size} rows, expected ${model.size}")
    prefixes.take(5).foreach { pre =>
      check(scanOf(reloaded, pre) == model.filter(_._1._1 == pre), s"reloaded prefix scan of $pre")
    }
    reloaded.abort(); fresh.close()
  }

  scenario("abort_discards_changes") {
    val dir = newDir()
    val p = provider(dir)
    commitVersion(p, 0, Map("a" -> 1))
    val s = p.getStore(1)
    s.put(key("b"), value(2)); s.abort()
    check(!s.hasCommitted, "aborted store reports committed")
    check(contents(p.getStore(1)) == Map(("a", 0) -> 1), "abort leaked changes")
    check(!new File(new java.net.URI(dir).getPath, "0/0/manifests/2.json").exists(), "abort wrote a manifest")
    p.close()
  }

  scenario("reload_every_version_from_a_new_provider") {
    val dir = newDir()
    val p = provider(dir)
    (1 to 6).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v), if (v > 2) Seq(s"k${v - 2}") else Nil))
    p.close()
    val fresh = provider(dir)
    for (v <- 1 to 6) {
      val expected = (math.max(1, v - 1) to v).map(i => (s"k$i", 0) -> i).toMap
      val got = contents(fresh.getStore(v))
      check(got == expected, s"version $v: $got != $expected")
    }
    // an older version can be the base of a new commit (Spark's retry of an earlier batch)
    check(commitVersion(fresh, 3, Map("x" -> 1)) == 4, "recommit from an older version")
    check(contents(fresh.getStore(4)) == Map(("k2", 0) -> 2, ("k3", 0) -> 3, ("x", 0) -> 1), "re-committed 4")
    fresh.close()
  }

  scenario("invalid_versions_fail_with_cannot_load_state_store") {
    val dir = newDir()
    val p = provider(dir)
    val neg = expectThrows[Throwable]("getStore(-1)")(p.getStore(-1))
    check(neg.isInstanceOf[SparkThrowable] &&
      neg.asInstanceOf[SparkThrowable].getCondition.startsWith("CANNOT_LOAD_STATE_STORE"),
      s"getStore(-1): ${messages(neg)}")
    commitVersion(p, 0, Map("a" -> 1))
    val missing = expectThrows[Throwable]("getStore(7)")(p.getStore(7))
    check(missing.isInstanceOf[SparkThrowable] &&
      missing.asInstanceOf[SparkThrowable].getCondition.startsWith("CANNOT_LOAD_STATE_STORE"),
      s"getStore(7) error class: ${messages(missing)}")
    val text = messages(missing)
    check(text.contains("version: 7") && text.contains("manifests/7.json") && text.contains("0/0"),
      s"error does not name store, version and file: $text")
    val ro = expectThrows[Throwable]("getReadStore(-1)")(p.getReadStore(-1))
    check(ro.isInstanceOf[SparkThrowable], s"getReadStore(-1): $ro")
    p.close()
  }

  scenario("prefix_scan") {
    val dir = newDir()
    val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
    val p = provider(dir, encoder = spec)
    val s = p.getStore(0)
    Seq(("a", 1), ("a", 2), ("b", 1), ("c", 5)).foreach { case (k, i) => s.put(key(k, i), value(i)) }
    def scan(st: ReadStateStore, pre: String): Set[(String, Int)] =
      st.prefixScan(prefix(pre)).map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1))).toSet
    check(scan(s, "a") == Set(("a", 1), ("a", 2)), s"uncommitted scan ${scan(s, "a")}")
    s.commit()
    val s1 = p.getStore(1)
    s1.put(key("a", 3), value(3)); s1.remove(key("a", 1))
    check(scan(s1, "a") == Set(("a", 2), ("a", 3)), s"mixed scan ${scan(s1, "a")}")
    check(scan(s1, "zzz").isEmpty, "unknown prefix")
    s1.commit(); p.close()
    val fresh = provider(dir, encoder = spec)
    check(scan(fresh.getStore(2), "a") == Set(("a", 2), ("a", 3)), "scan after reload from the worker")
    check(scan(fresh.getReadStore(2), "b") == Set(("b", 1)), "scan on a read store")
    val plain = provider(newDir())
    expectThrows[IllegalStateException]("prefixScan without prefix encoder")(plain.getStore(0).prefixScan(prefix("a")))
    fresh.close(); plain.close()
  }

  scenario("read_store_then_upgrade_to_write_store") {
    val p = provider(newDir())
    commitVersion(p, 0, Map("a" -> 1))
    val pool = Executors.newSingleThreadExecutor()
    try {
      val f = pool.submit(new Callable[Long] {
        override def call(): Long = {
          val read = p.getReadStore(1)
          check(intOf(read.get(key("a"))).contains(1), "read store value")
          val write = p.upgradeReadStoreToWriteStore(read, 1, None)
          write.put(key("b"), value(2))
          val v = write.commit()
          read.release()
          v
        }
      })
      check(f.get(60, TimeUnit.SECONDS) == 2, "upgraded store commits version 2")
    } finally pool.shutdownNow()
    check(contents(p.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "upgraded commit content")
    p.close()
  }

  scenario("maintenance_applies_min_batches_to_retain") {
    val dir = newDir()
    val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "2",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      "spark.sql.streaming.stateStore.pystatestore.orphanGraceSeconds" -> "10")
    val p = provider(dir, conf = conf)
    def manifests = new File(new java.net.URI(dir).getPath, "0/0/manifests").list().sorted.toSeq
    if (changelogCommits) {
      // Maintenance (as Spark's thread runs it between batches) makes a snapshot every 2 versions.
      // While the newest snapshot of a retained version's chain is younger than the grace period,
      // the chain back to the one before it stays, for restores that were walking it.
      (1 to 10).foreach { v => commitVersion(p, v - 1, Map(s"k$v" -> v)); p.doMaintenance() }
      check(manifests == Seq("10.json", "6.json", "7.json", "8.json", "9.json"),
        s"manifests after maintenance within the grace period: $manifests")
      Thread.sleep(10500)
    } else {
      (1 to 10).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v)))
    }
    p.doMaintenance()
    check(manifests == Seq("10.json", "8.json", "9.json"), s"manifests after maintenance: $manifests")
    val fresh = provider(dir, conf = conf)
    check(contents(fresh.getStore(8)).size == 8, "retained version 8 loads")
    val gone = expectThrows[Throwable]("load of removed version 5")(fresh.getStore(5))
    check(messages(gone).contains("version: 5"), s"removed version error: ${messages(gone)}")
    p.close(); fresh.close()
  }

  scenario("a_provider_that_only_reads_never_deletes") {
    val dir = newDir()
    // Snapshot commits: every version stands alone, so retention can drop all but the newest three.
    val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "2",
      "spark.sql.streaming.stateStore.pystatestore.commitMode" -> "snapshot")
    val writer = provider(dir, conf = conf)
    (1 to 6).foreach(v => commitVersion(writer, v - 1, Map(s"k$v" -> v)))
    val manifests = new File(new java.net.URI(dir).getPath, "0/0/manifests")
    val reader = provider(dir, conf = conf)
    check(contents(reader.getReadStore(6)).size == 6, "reader sees version 6")
    reader.doMaintenance()
    check(manifests.list().length == 6, s"a read-only provider deleted files: ${manifests.list().toSeq}")
    writer.doMaintenance()
    check(manifests.list().length == 3, s"the writer's maintenance applies retention: ${manifests.list().toSeq}")
    reader.close(); writer.close()
  }

  scenario("metrics_match_supported_custom_metrics") {
    val p = provider(newDir())
    val s = p.getStore(0)
    (1 to 5).foreach(i => s.put(key(s"k$i"), value(i)))
    s.commit()
    val m = s.metrics
    check(m.numKeys == 5, s"numKeys ${m.numKeys}")
    check(m.memoryUsedBytes > 0, "memoryUsedBytes")
    val names = p.supportedCustomMetrics.map(_.name).toSet
    check(m.customMetrics.keySet.map(_.name) == names, s"custom metrics ${m.customMetrics.keySet.map(_.name)} vs $names")
    val byName = m.customMetrics.map { case (k, v) => k.name -> v }
    check(byName("pystatestoreBytesWritten") > 0, "bytes written")
    check(byName("pystatestoreChangedRows") == 5, s"changed rows ${byName("pystatestoreChangedRows")}")
    val info = s.getStateStoreCheckpointInfo()
    check(info.batchVersion == 1 && info.partitionId == 0 && info.stateStoreCkptId.isEmpty, s"checkpoint info $info")
    p.close()
  }

  scenario("column_families_need_rocksdb_and_stray_calls_are_refused_clearly") {
    if (backend == "memory") {
      val e = expectThrows[Throwable]("init with column families")(provider(newDir(), useColumnFamilies = true))
      check(messages(e).contains("backend=rocksdb"), s"column family error: ${messages(e)}")
    }
    val p = provider(newDir())
    val s = p.getStore(0)
    val mv = expectThrows[Throwable]("merge")(s.merge(key("a"), value(1)))
    check(messages(mv).contains("multiple values"), s"merge error: ${messages(mv)}")
    val cf = expectThrows[Throwable]("get on another family")(s.get(key("a"), "other"))
    check(messages(cf).toLowerCase.contains("column famil"), s"cf error: ${messages(cf)}")
    s.abort(); p.close()
  }

  // ---- checkpoint format v2: every attempt of a version is loadable by its id ----
  scenario("checkpoint_ids_name_every_attempt_across_restarts") {
    val dir = newDir()
    val v2 = sqlConf("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "2")
    def commitOn(p: StateStoreProvider, base: Long, id: Option[String], puts: Map[String, Int]): StateStoreCheckpointInfo = {
      val s = p.getStore(base, id)
      puts.foreach { case (k, v) => s.put(key(k), value(v)) }
      try { s.commit(); s.getStateStoreCheckpointInfo() } finally s.release()
    }
    def read(p: StateStoreProvider, version: Long, id: String): Map[(String, Int), Int] = {
      val r = p.getReadStore(version, Some(id))
      try contents(r) finally r.release()
    }
    val p = provider(dir, conf = v2)
    val first = commitOn(p, 0, None, Map("a" -> 1))
    check(first.batchVersion == 1 && first.partitionId == 0 && first.baseStateStoreCkptId.isEmpty &&
      first.stateStoreCkptId.exists(_.matches("[0-9a-f]{32}")), s"version 1 info $first")
    val id1 = first.stateStoreCkptId.get
    // Two attempts at version 2 (a retried or speculative task): both stay, each under its id.
    val b = commitOn(p, 1, Some(id1), Map("b" -> 2))
    val c = commitOn(p, 1, Some(id1), Map("c" -> 3))
    check(b.baseStateStoreCkptId.contains(id1) && c.baseStateStoreCkptId.contains(id1), s"bases $b $c")
    val (idB, idC) = (b.stateStoreCkptId.get, c.stateStoreCkptId.get)
    check(idB != idC, s"two attempts got one id $idB")
    // Version 3 on the attempt that did not commit last: what Spark does when its commit log names it.
    val d = commitOn(p, 2, Some(idB), Map("d" -> 4))
    check(d.batchVersion == 3 && d.baseStateStoreCkptId.contains(idB), s"version 3 info $d")
    p.close()
    val again = provider(dir, conf = v2) // a restart: nothing cached
    check(read(again, 2, idB) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"attempt B ${read(again, 2, idB)}")
    check(read(again, 2, idC) == Map(("a", 0) -> 1, ("c", 0) -> 3), s"attempt C ${read(again, 2, idC)}")
    check(read(again, 3, d.stateStoreCkptId.get) == Map(("a", 0) -> 1, ("b", 0) -> 2, ("d", 0) -> 4),
      s"version 3 ${read(again, 3, d.stateStoreCkptId.get)}")
    // After reading C, a write store on B must not reuse C (cached at the same version).
    val onB = again.getStore(2, Some(idB))
    check(contents(onB) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"write store on B ${contents(onB)}")
    onB.abort(); onB.release()
    val unknown = "0123456789abcdef0123456789abcdef"
    val missing = expectThrows[Throwable]("an id never committed")(again.getReadStore(2, Some(unknown)))
    check(messages(missing).contains(s"manifests/2-$unknown.json"),
      s"missing id error: ${messages(missing)}")
    val forged = expectThrows[Throwable]("an id that is a path")(again.getReadStore(2, Some("../../x")))
    check(messages(forged).contains("not one pystatestore writes"), s"forged id error: ${messages(forged)}")
    again.close()
  }

  // ---- column families (transformWithState's layout; rocksdb backend) ----
  val rangeKeySchema: StructType = StructType(Seq(
    StructField("l", LongType), StructField("d", DoubleType), StructField("s", StringType)))
  private val rangeKeyProj = UnsafeProjection.create(rangeKeySchema)
  def rangeKey(l: java.lang.Long, d: java.lang.Double, s: String): UnsafeRow = rangeKeyProj.synchronized {
    rangeKeyProj(InternalRow(l, d, UTF8String.fromString(s))).copy()
  }
  /** The families these scenarios declare: plain, prefix-scan, range-scan and several values per key. */
  def declareFamilies(s: StateStore, order: Seq[String] = Seq("plain", "prefixed", "ranged", "listed")): Unit =
    order.foreach {
      case "plain" => s.createColFamilyIfAbsent("plain", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
      case "prefixed" => s.createColFamilyIfAbsent("prefixed", keySchema, valueSchema,
        PrefixKeyScanStateEncoderSpec(keySchema, 1))
      case "ranged" => s.createColFamilyIfAbsent("ranged", rangeKeySchema, valueSchema,
        RangeKeyScanStateEncoderSpec(rangeKeySchema, Seq(0, 1)))
      case "listed" => s.createColFamilyIfAbsent("listed", keySchema, valueSchema,
        NoPrefixKeyStateEncoderSpec(keySchema), useMultipleValuesPerKey = true)
    }
  def familyContents(s: ReadStateStore, family: String): Map[(String, Int), Int] =
    s.iterator(family).map(p => (p.key.getUTF8String(0).toString, p.key.getInt(1)) -> p.value.getInt(0)).toMap
  def valuesOf(s: ReadStateStore, k: UnsafeRow): Seq[Int] = s.valuesIterator(k, "listed").map(_.getInt(0)).toSeq

  scenario("column_families_keep_their_keys_apart_across_commits_restarts_and_removal") {
    if (backend == "rocksdb") {
      val dir = newDir()
      val p = provider(dir, useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      s.put(key("a"), value(1), "plain"); s.put(key("a"), value(2), "prefixed"); s.put(key("b"), value(3), "prefixed")
      s.put(key("x"), value(9)) // Spark's default family
      check(intOf(s.get(key("a"), "plain")).contains(1) && intOf(s.get(key("a"), "prefixed")).contains(2),
        "one key, two families, two values")
      check(s.prefixScan(prefix("b"), "prefixed").map(_.value.getInt(0)).toSeq == Seq(3), "prefix scan in a family")
      s.commit()
      p.close()
      // A restart declares the families in another order: they keep their ids (the checkpoint's registry).
      val q = provider(dir, useColumnFamilies = true)
      val s1 = q.getStore(1)
      declareFamilies(s1, Seq("listed", "ranged", "prefixed", "plain"))
      check(familyContents(s1, "plain") == Map(("a", 0) -> 1), s"plain after restart: ${familyContents(s1, "plain")}")
      check(familyContents(s1, "prefixed") == Map(("a", 0) -> 2, ("b", 0) -> 3), "prefixed after restart")
      check(intOf(s1.get(key("x"))).contains(9), "default family after restart")
      check(s1.removeColFamilyIfExists("plain"), "removing an existing family says so")
      check(!s1.removeColFamilyIfExists("never"), "removing an absent family says so")
      check(s1.get(key("a"), "plain") == null, "a removed family reads empty")
      s1.commit()
      val s2 = q.getStore(2)
      declareFamilies(s2)
      check(familyContents(s2, "plain").isEmpty, s"removed family after commit: ${familyContents(s2, "plain")}")
      check(familyContents(s2, "prefixed").size == 2, "other families untouched by a removal")
      s2.put(key("c"), value(5), "plain")
      s2.commit()
      val r = q.getReadStore(3)
      check(familyContents(r, "plain") == Map(("c", 0) -> 5), s"re-created family: ${familyContents(r, "plain")}")
      r.abort()
      q.close()
    }
  }

  scenario("num_keys_leaves_internal_families_out_as_spark_counts_them") {
    if (backend == "rocksdb") {
      val dir = newDir()
      def declare(s: StateStore): Unit = {
        declareFamilies(s, Seq("plain", "listed"))
        s.createColFamilyIfAbsent("$timers", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          isInternal = true)
      }
      val p = provider(dir, useColumnFamilies = true)
      val s0 = p.getStore(0)
      declare(s0)
      val reserved = expectThrows[Throwable]("a user's family named with $")(
        s0.createColFamilyIfAbsent("$mine", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema)))
      check(messages(reserved).contains("RESERVED_CHARS"), s"reserved name error: ${messages(reserved)}")
      s0.put(key("a"), value(1), "plain"); s0.put(key("b"), value(2), "plain")
      s0.merge(key("a"), value(3), "listed"); s0.merge(key("a"), value(4), "listed") // one key, two values
      Seq("t1", "t2", "t3").foreach(t => s0.put(key(t), value(0), "$timers"))
      s0.commit()
      // Spark's RocksDB counts the keys of users' families only (a list is one key).
      check(s0.metrics.numKeys == 3, s"numKeys after the first commit: ${s0.metrics.numKeys}, expected 3")
      p.close()
      val q = provider(dir, useColumnFamilies = true) // a restart: the counts come from the checkpoint
      val s1 = q.getStore(1)
      declare(s1)
      check(s1.metrics.numKeys == 3, s"numKeys after a restart: ${s1.metrics.numKeys}, expected 3")
      s1.remove(key("t1"), "$timers"); s1.put(key("t4"), value(0), "$timers"); s1.put(key("c"), value(5), "plain")
      s1.commit()
      check(s1.metrics.numKeys == 4, s"numKeys after timers moved and a key was added: ${s1.metrics.numKeys}")
      q.close()
      val again = provider(dir, useColumnFamilies = true)
      val r = again.getStore(2)
      check(r.metrics.numKeys == 4, s"numKeys of version 2 after a restart: ${r.metrics.numKeys}, expected 4")
      r.abort()
      again.close()
    }
  }

  scenario("a_removed_familys_id_is_never_given_again") {
    if (changelogCommits) {
      val p = provider(newDir(), useColumnFamilies = true)
      def declare(s: StateStore, name: String): Unit =
        s.createColFamilyIfAbsent(name, keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
      val s0 = p.getStore(0)
      declare(s0, "old")
      s0.put(key("a"), value(1), "old"); s0.put(key("b"), value(2), "old")
      s0.commit()
      val s1 = p.getStore(1)
      check(s1.removeColFamilyIfExists("old"), "old existed")
      s1.commit()
      val s2 = p.getStore(2)
      declare(s2, "new")
      s2.put(key("c"), value(3), "new")
      s2.commit()
      // The change feed of the new family over every version: had it taken the removed family's
      // id, the removed family's puts and deletes would show as its own.
      val feed: Iterator[(Any, UnsafeRow, UnsafeRow, Long)] = p.getStateStoreChangeDataReader(1, 3, Some("new"), None)
      val rows = feed.map { case (kind, k, _, batch) => (kind.toString, k.getUTF8String(0).toString, batch) }.toList
      check(rows.map(r => (r._2, r._3)) == List(("c", 2L)), s"change feed of the new family: $rows")
      p.close()
    }
  }

  scenario("several_values_per_key_merge_put_and_remove_across_commits") {
    if (backend == "rocksdb") {
      val p = provider(newDir(), useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      s.merge(key("a"), value(1), "listed"); s.merge(key("a"), value(2), "listed")
      s.mergeList(key("a"), Array(value(3), value(4)), "listed")
      s.putList(key("b"), Array(value(7), value(8)), "listed")
      check(valuesOf(s, key("a")) == Seq(1, 2, 3, 4), s"merged values: ${valuesOf(s, key("a"))}")
      s.commit()
      val s1 = p.getStore(1)
      declareFamilies(s1)
      check(valuesOf(s1, key("a")) == Seq(1, 2, 3, 4) && valuesOf(s1, key("b")) == Seq(7, 8), "values after commit")
      s1.merge(key("b"), value(9), "listed")
      s1.putList(key("a"), Array(value(5)), "listed")
      s1.remove(key("b"), "listed")
      s1.merge(key("b"), value(10), "listed")
      s1.commit()
      val r = p.getReadStore(2)
      check(valuesOf(r, key("a")) == Seq(5) && valuesOf(r, key("b")) == Seq(10), s"values at 2: ${valuesOf(r, key("b"))}")
      check(valuesOf(r, key("none")).isEmpty, "no values for an absent key")
      val misuse = expectThrows[Throwable]("merge into a single-value family")(p.getStore(2).merge(key("a"), value(1), "plain"))
      check(messages(misuse).contains("useMultipleValuesPerKey"), s"merge error: ${messages(misuse)}")
      r.abort(); p.close()
    }
  }

  scenario("range_scan_families_iterate_in_the_order_of_their_ordering_columns") {
    if (backend == "rocksdb") {
      // The referee: Scala's orderings on the values themselves (nulls last, doubles by
      // java.lang.Double.compare: -0.0 before 0.0, NaN after +Infinity), never the byte codec.
      val rnd = new scala.util.Random(11)
      val longs: Seq[java.lang.Long] = Seq[java.lang.Long](null, Long.MinValue, Long.MaxValue, -1L, 0L, 1L, -256L, 255L) ++
        Seq.fill(12)(java.lang.Long.valueOf(rnd.nextLong() >> rnd.nextInt(60)))
      val doubles: Seq[java.lang.Double] = Seq[java.lang.Double](null, -0.0, 0.0, Double.NaN, Double.NegativeInfinity,
        Double.PositiveInfinity, -1.5, 1.5, Double.MinPositiveValue, -Double.MaxValue)
      val rows = (for (l <- longs.distinct; d <- doubles) yield (l, d)).toIndexedSeq
      // Indices, not values: Scala's == on boxed doubles takes -0.0 for 0.0 and NaN for nothing.
      val want = rows.indices.sortWith { (i, j) =>
        val ((l1, d1), (l2, d2)) = (rows(i), rows(j))
        def nullsLast[T](a: T, b: T)(cmp: (T, T) => Int): Int =
          if (a == null && b == null) 0 else if (a == null) 1 else if (b == null) -1 else cmp(a, b)
        val byLong = nullsLast(l1, l2)((x, y) => java.lang.Long.compare(x, y))
        (if (byLong != 0) byLong else nullsLast(d1, d2)((x, y) => java.lang.Double.compare(x, y))) < 0
      }
      val p = provider(newDir(), useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      val (first, second) = rnd.shuffle(rows.indices.toList).splitAt(rows.length / 2)
      first.foreach { i => s.put(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), value(i), "ranged") }
      s.commit()
      val s1 = p.getStore(1)
      declareFamilies(s1)
      second.foreach { i => s1.put(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), value(i), "ranged") }
      def order(st: ReadStateStore): Seq[Int] = st.iterator("ranged").map(_.value.getInt(0)).toSeq
      check(order(s1) == want, s"buffer merged with the base: ${order(s1).take(8)} vs ${want.take(8)}")
      val dropped = want.filter(_ % 3 == 0).toSet
      dropped.foreach { i => s1.remove(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), "ranged") }
      check(order(s1) == want.filterNot(dropped), s"deletes hide base pairs before commit: ${order(s1).take(8)}")
      val rewritten = first.filterNot(dropped).head // a base key written again: seen once, with its new value
      s1.put(rangeKey(rows(rewritten)._1, rows(rewritten)._2, s"r$rewritten"), value(rewritten), "ranged")
      check(order(s1) == want.filterNot(dropped), s"a rewritten base key is seen once: ${order(s1).take(8)}")
      s1.commit()
      val r = p.getReadStore(2)
      check(order(r) == want.filterNot(dropped), s"after commit: ${order(r).take(8)}")
      check(r.iterator("ranged").forall(pr => pr.key.getUTF8String(2).toString == s"r${pr.value.getInt(0)}"),
        "keys decode whole")
      r.abort(); p.close()
    }
  }

  scenario("worker_death_fails_the_commit_and_the_next_task_recovers") {
    val dir = newDir()
    val p = provider(dir)
    commitVersion(p, 0, Map("a" -> 1))
    val worker = StateWorker.workerFor(0).get
    val deadWorkersDatabases = Option(worker.localStateDir.listFiles()).toSeq.flatten.flatMap { d =>
      Option(d.listFiles()).toSeq.flatten
    }
    check(backend != "rocksdb" || deadWorkersDatabases.nonEmpty, s"no local databases under ${worker.localStateDir}")
    val s = p.getStore(1)
    s.put(key("b"), value(2))
    // Freeze the worker so the commit is surely in flight, then kill it mid-call.
    new ProcessBuilder("kill", "-STOP", worker.pid.toString).start().waitFor()
    val pool = Executors.newSingleThreadExecutor()
    val inFlight = pool.submit(new Callable[Long] { override def call(): Long = s.commit() })
    // The commit's change frame appears just before its call is sent; the frozen worker keeps it.
    def frameWritten: Boolean = Option(worker.exchangeDir.list()).exists(_.exists(_.startsWith("commit-")))
    check(awaitCondition(frameWritten, inFlight.isDone), s"the commit wrote no change frame to ${worker.exchangeDir} within 60 s")
    Thread.sleep(300)
    worker.process.destroyForcibly().waitFor()
    val e = expectThrows[Throwable]("commit against a dying worker") {
      try inFlight.get(60, TimeUnit.SECONDS) catch { case ee: java.util.concurrent.ExecutionException => throw ee.getCause }
    }
    pool.shutdownNow()
    val text = messages(e)
    check(text.contains("died") && text.contains(worker.logFile.getPath),
      s"error should say the worker died and where its log is: $text")
    s.abort()
    // the retried task: same version again, a fresh worker that reloads version 1 from the checkpoint
    check(commitVersion(p, 1, Map("b" -> 2)) == 2, "retry commits")
    check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
    val leftBehind = deadWorkersDatabases.filter(_.exists)
    check(leftBehind.isEmpty, s"the dead worker's local databases were left behind: ${leftBehind.take(3)}")
    val fresh = provider(dir)
    check(contents(fresh.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "state after worker restart")
    p.close(); fresh.close()
  }

  scenario("a_version_whose_apply_failed_after_its_commit_is_read_whole") {
    // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) fails the worker's apply of the first
    // commit of any store whose directory contains "apply-fails", after that commit replied
    // (durable first, rocksdb changelog): its view must come from the checkpoint instead.
    val dir = Files.createTempDirectory(workDir, "apply-fails").toUri.toString
    val p = provider(dir)
    commitVersion(p, 0, Map("a" -> 1, "b" -> 2))
    val s = p.getStore(1) // from the cache: the view the failed apply never made
    check(contents(s) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"version 1 after a failed apply: ${contents(s)}")
    s.put(key("c"), value(3))
    s.remove(key("a"))
    check(s.commit() == 2, "a commit on the version whose apply failed")
    val byName = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
    if (backend == "rocksdb" && commitMode != "snapshot") {
      check(byName("pystatestoreApplyFailures") == 1, s"apply failures reported: ${byName("pystatestoreApplyFailures")}")
      check(byName.contains("pystatestoreViewWaitMs"), "view wait reported")
    }
    s.release()
    check(contents(p.getStore(2)) == Map(("b", 0) -> 2, ("c", 0) -> 3), "version 2, read from the cache")
    val fresh = provider(dir)
    check(contents(fresh.getStore(2)) == Map(("b", 0) -> 2, ("c", 0) -> 3), "version 2 from the checkpoint")
    p.close(); fresh.close()
  }

  scenario("worker_killed_between_calls_is_replaced_transparently") {
    val dir = newDir()
    val p = provider(dir)
    commitVersion(p, 0, Map("a" -> 1))
    val worker = StateWorker.workerFor(0).get
    worker.process.destroyForcibly().waitFor()
    // Nothing was in flight, so nothing fails: the next call starts a worker that reloads version 1.
    check(commitVersion(p, 1, Map("b" -> 2)) == 2, "commit after the worker was killed while idle")
    check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
    check(contents(provider(dir).getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "state after restart")
    p.close()
  }

  scenario("a_bad_worker_count_is_refused_naming_the_conf") {
    for (bad <- Seq("0", "many", "65")) {
      val e = expectThrows[Throwable](s"workers=$bad") {
        provider(newDir(), conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.workers" -> bad))
      }
      check(messages(e).contains(s"spark.sql.streaming.stateStore.pystatestore.workers=$bad") &&
        messages(e).contains("fix or unset it"), s"workers=$bad: ${messages(e)}")
    }
  }

  scenario("partitions_are_spread_over_the_pool_and_one_worker_dying_spares_the_others") {
    val dir = newDir()
    val ps = (0 until 2).map(part => provider(dir, partition = part))
    ps.zipWithIndex.foreach { case (p, part) => commitVersion(p, 0, Map(s"p$part" -> 1)) }
    val pool = StateWorker.currentWorkers
    // local[2] on this machine: one worker per task slot, at most one per core
    val expected = math.min(2, Runtime.getRuntime.availableProcessors())
    check(pool.size == expected, s"expected $expected workers in this JVM, found ${pool.map(_.describe)}")
    if (expected == 2) {
      val Seq(w0, w1) = Seq(0, 1).map(part => StateWorker.workerFor(part).get)
      check(w0.pid != w1.pid && w0.localStateDir != w1.localStateDir, s"partitions 0 and 1 share ${w0.describe}")
      def hasLocalDb: Boolean = backend != "rocksdb" || Option(w1.localStateDir.list()).exists(_.nonEmpty)
      check(hasLocalDb, s"no local database under ${w1.localStateDir}")
      w0.process.destroyForcibly().waitFor()
      check(commitVersion(ps(0), 1, Map("p0b" -> 2)) == 2, "partition 0 commits after its worker was killed")
      check(StateWorker.workerFor(1).get eq w1, "partition 1's worker must not be replaced for another's death")
      check(hasLocalDb, "partition 1's local database was deleted")
      check(contents(ps(1).getStore(1)) == Map(("p1", 0) -> 1), "partition 1 reads from its worker")
    }
    ps.foreach(_.close())
  }

  scenario("two_partitions_commit_concurrently") {
    val dir = newDir()
    val pool = Executors.newFixedThreadPool(4)
    try {
      val futures = (0 until 4).map { part =>
        pool.submit(new Callable[Map[(String, Int), Int]] {
          override def call(): Map[(String, Int), Int] = {
            val p = provider(dir, partition = part)
            (1 to 5).foreach(v => commitVersion(p, v - 1, Map(s"p$part-$v" -> v)))
            val c = contents(p.getStore(5))
            p.close(); c
          }
        })
      }
      futures.zipWithIndex.foreach { case (f, part) =>
        val c = f.get(120, TimeUnit.SECONDS)
        check(c == (1 to 5).map(v => (s"p$part-$v", 0) -> v).toMap, s"partition $part: $c")
      }
    } finally pool.shutdownNow()
  }

  scenario("a_python_that_cannot_run_the_worker_gives_a_clear_error") {
    StateWorker.currentWorkers.foreach(_.process.destroyForcibly().waitFor())
    val p = provider(newDir(), conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.pythonExec" -> "/bin/false"))
    val s = p.getStore(0)
    s.put(key("a"), value(1))
    val e = expectThrows[Throwable]("commit with a broken interpreter")(s.commit())
    val text = messages(e)
    check(text.contains("/bin/false") && text.contains("exited with code 1") &&
      text.contains("spark.sql.streaming.stateStore.pystatestore.pythonExec"), s"unclear error: $text")
    s.abort(); p.close()
    // a later store with a working interpreter starts a proper worker
    val good = provider(newDir())
    check(commitVersion(good, 0, Map("a" -> 1)) == 1, "a good worker starts after a failed one")
    good.close()
  }

  scenario("two_attempts_at_one_version_the_last_wins_and_the_loser_reloads") {
    val dir = newDir()
    val first = provider(dir)
    val second = provider(dir) // another executor's provider of the same store
    commitVersion(first, 0, Map("a" -> 1))
    check(commitVersion(first, 1, Map("b" -> 1)) == 2, "first attempt at version 2")
    check(commitVersion(second, 1, Map("b" -> 2)) == 2, "second attempt at version 2 (Spark's retry)")
    check(contents(provider(dir).getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "the last manifest wins")
    // The first provider's cached version 2 is an attempt the checkpoint no longer holds: building
    // version 3 on it must fail, and the retried task must see the winning attempt.
    val stale = first.getStore(2)
    stale.put(key("c"), value(3))
    val refused = expectThrows[Throwable]("commit on a replaced base")(stale.commit())
    check(messages(refused).contains("now holds attempt"), s"refusal should explain: ${messages(refused)}")
    stale.abort()
    check(contents(first.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "the retry reloads the winner")
    check(commitVersion(first, 2, Map("c" -> 3)) == 3, "the retry commits")
    check(contents(provider(dir).getStore(3)) == Map(("a", 0) -> 1, ("b", 0) -> 2, ("c", 0) -> 3), "version 3")
    first.close(); second.close()
  }

  scenario("maintenance_concurrent_with_commits_loses_nothing") {
    val dir = newDir()
    val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "2",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      "spark.sql.streaming.stateStore.pystatestore.orphanGraceSeconds" -> "10")
    val writer = provider(dir, conf = conf)
    val gc = provider(dir, conf = conf) // another instance that also wrote, so its maintenance deletes
    commitVersion(gc, 0, Map("seed" -> 0))
    val stop = new java.util.concurrent.atomic.AtomicBoolean(false)
    val completedRuns = new java.util.concurrent.atomic.AtomicInteger(0)
    val pool = Executors.newSingleThreadExecutor()
    val maintenance = pool.submit(new Callable[Int] {
      override def call(): Int = {
        while (!stop.get) { gc.doMaintenance(); writer.doMaintenance(); completedRuns.incrementAndGet() }
        completedRuns.get
      }
    })
    // Every fourth commit waits for a maintenance run to finish after the previous wait, so GC
    // interleaves with the commits however slow maintenance is next to a commit on this machine.
    var seenRuns = 0
    def awaitAnotherRun(v: Int): Unit = {
      awaitCondition(completedRuns.get > seenRuns, maintenance.isDone)
      if (maintenance.isDone) maintenance.get() // a failed run: its exception is the finding
      check(completedRuns.get > seenRuns, s"no maintenance run finished within 60 s before committing version $v")
      seenRuns = completedRuns.get
    }
    try {
      (2 to 25).foreach { v =>
        if (v % 4 == 2 && v > 2) awaitAnotherRun(v)
        commitVersion(writer, v - 1, Map(s"k$v" -> v), if (v > 3) Seq(s"k${v - 2}") else Nil)
      }
    } finally stop.set(true)
    val runs = maintenance.get(60, TimeUnit.SECONDS)
    pool.shutdownNow()
    check(runs > 3, s"maintenance ran only $runs times")
    writer.doMaintenance() // a snapshot of version 25, if the loop made none
    if (changelogCommits) Thread.sleep(10500) // the chains older snapshots start go once the newer ones settle
    writer.doMaintenance()
    val fresh = provider(dir, conf = conf)
    for (v <- 23 to 25) {
      val expected = Map(("seed", 0) -> 0) ++ (math.max(2, v - 1) to v).map(i => (s"k$i", 0) -> i)
      check(contents(fresh.getStore(v)) == expected, s"version $v after concurrent GC: ${contents(fresh.getStore(v))}")
    }
    val storeRoot = new File(new java.net.URI(dir).getPath, "0/0")
    val manifests = new File(storeRoot, "manifests").list().sorted.toSeq
    // With changelog commits version 23's chain starts at the newest snapshot at or before it, which
    // depends on when the maintenance runs happened to fall; it and what follows must be retained.
    val oldestNeeded = if (changelogCommits) {
      val snapshots = Option(new File(storeRoot, "snapshots").list()).toSeq.flatten.map(_.takeWhile(_ != '-').toInt)
      (1 +: snapshots.filter(_ <= 23)).max
    } else 23
    val versions = manifests.map(_.stripSuffix(".json").toInt).sorted
    check(versions.takeRight(3) == Seq(23, 24, 25) && versions.head >= oldestNeeded, s"retention applied: $manifests")
    writer.close(); gc.close(); fresh.close()
  }

  scenario("a_commit_slower_than_the_orphan_grace_keeps_its_files_against_concurrent_gc") {
    // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) stalls the first commit of any store
    // whose directory contains "slow-commit" for 20 s after its uploads: longer than the smallest
    // orphan grace (10 s), while another instance of the store collects garbage all along. Only the
    // commit's lease keeps its uploaded files from being taken for a crashed attempt's orphans.
    val dir = Files.createTempDirectory(workDir, "slow-commit").toUri.toString
    // Without local recovery copies, which would mask files lost from the checkpoint.
    val conf = sqlConf(
      "spark.sql.streaming.stateStore.pystatestore.orphanGraceSeconds" -> "10",
      "spark.sql.streaming.stateStore.pystatestore.localRecovery" -> "false")
    val slow = provider(dir, conf = conf)
    val pool = Executors.newSingleThreadExecutor()
    val inFlight = pool.submit(new Callable[Long] {
      override def call(): Long = commitVersion(slow, 0, Map("slow" -> 1, "also" -> 2))
    })
    // The stall rule fires once per worker: wait until the slow commit holds it (the worker logs the
    // injection) before the competing commit can reach the same point. Timing from here errs late.
    val dirName = new File(new java.net.URI(dir).getPath).getName // unique: slow-commit<random>
    def stalling(line: String): Boolean = line.contains("commit:uploaded for store") && line.contains(dirName)
    def stallLogged: Boolean = StateWorker.workerFor(0).exists { w =>
      w.logFile.exists() && Files.readAllLines(w.logFile.toPath).asScala.exists(stalling)
    }
    check(awaitCondition(stallLogged, inFlight.isDone), s"the slow commit did not reach its stall within 60 s (done: ${inFlight.isDone})")
    val stallStarted = System.nanoTime()
    val gc = provider(dir, conf = conf)
    commitVersion(gc, 0, Map("competing" -> 9)) // another attempt at version 1: it may now delete
    // What matters is GC running once the slow attempt's files are older than the grace (10 s),
    // however long a maintenance run takes on this machine.
    var runs = 0
    var runsPastGrace = 0
    while (!inFlight.isDone) {
      if (System.nanoTime() - stallStarted > TimeUnit.MILLISECONDS.toNanos(11000)) runsPastGrace += 1
      gc.doMaintenance(); runs += 1; Thread.sleep(200)
    }
    check(inFlight.get() == 1, "the slow commit")
    pool.shutdownNow()
    check(runsPastGrace > 0, s"no maintenance run started past the grace during the slow commit ($runs in all)")
    gc.doMaintenance()
    val fresh = provider(dir, conf = conf)
    // The slow attempt's manifest was written last, so it is version 1; every file it names exists.
    check(contents(fresh.getStore(1)) == Map(("slow", 0) -> 1, ("also", 0) -> 2), "version 1 after GC")
    slow.close(); gc.close(); fresh.close()
  }

  scenario("a_frozen_worker_fails_the_call_within_bounds") {
    val dir = newDir()
    val p = provider(dir, conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.workerProbeIntervalMs" -> "1000"))
    commitVersion(p, 0, Map("a" -> 1))
    val worker = StateWorker.workerFor(0).get
    val s = p.getStore(1)
    s.put(key("b"), value(2))
    s.get(key("a")) // the view of version 1 is ready (durable first): the commit is the call that meets the frozen worker
    new ProcessBuilder("kill", "-STOP", worker.pid.toString).start().waitFor()
    val started = System.nanoTime()
    val e = expectThrows[Throwable]("commit against a frozen worker")(s.commit())
    val tookMs = (System.nanoTime() - started) / 1000000
    val text = messages(e)
    check(tookMs < 15000, s"a frozen worker held the task for $tookMs ms")
    check(text.contains("stopped answering") && text.contains(s"pid ${worker.pid}") &&
      text.contains(worker.logFile.getPath) && text.contains("commit of"), s"unclear error: $text")
    s.abort()
    check(commitVersion(p, 1, Map("b" -> 2)) == 2, "the retry commits with a new worker")
    check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
    p.close()
  }

  scenario("a_call_stuck_in_one_store_times_out_alone") {
    // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) stalls the first commit of any
    // store whose directory contains "stuck-store" for 8 s in the worker.
    val stuckDir = Files.createTempDirectory(workDir, "stuck-store").toUri.toString
    val conf = sqlConf(
      "spark.sql.streaming.stateStore.pystatestore.callTimeoutMs" -> "2500",
      "spark.sql.streaming.stateStore.pystatestore.workerProbeIntervalMs" -> "1000")
    val stuck = provider(stuckDir, conf = conf)
    val healthy = provider(newDir(), conf = conf)
    commitVersion(healthy, 0, Map("warm" -> 1)) // the worker is up
    val worker = StateWorker.workerFor(0).get
    val pool = Executors.newSingleThreadExecutor()
    val inFlight = pool.submit(new Callable[Long] { override def call(): Long = commitVersion(stuck, 0, Map("a" -> 1)) })
    Thread.sleep(300)
    check(commitVersion(healthy, 1, Map("other" -> 2)) == 2, "another store commits while one is stuck")
    val e = expectThrows[Throwable]("the stuck commit") {
      try inFlight.get(30, TimeUnit.SECONDS) catch { case ee: java.util.concurrent.ExecutionException => throw ee.getCause }
    }
    pool.shutdownNow()
    val text = messages(e)
    check(text.contains("did not return within 2500 ms") && text.contains("stuck-store") &&
      text.contains(s"pid ${worker.pid}") && text.contains(worker.logFile.getPath), s"unclear timeout: $text")
    check(StateWorker.workerFor(0).get eq worker, "the worker must not be replaced for one stuck call")
    check(commitVersion(healthy, 2, Map("more" -> 3)) == 3, "the healthy store still commits")
    // The retried task opens the store afresh and does not queue behind the stuck call.
    val retryStarted = System.nanoTime()
    check(commitVersion(stuck, 0, Map("a" -> 1)) == 1, "the retry of the stuck store commits")
    check((System.nanoTime() - retryStarted) / 1000000 < 2500, "the retry waited for the stuck call")
    stuck.close(); healthy.close()
  }

  scenario("a_transport_error_fails_only_that_call") {
    // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) closes the connection of the first
    // commit of any store whose directory contains "severed-store", as a network failure would.
    val severedDir = Files.createTempDirectory(workDir, "severed-store").toUri.toString
    val severed = provider(severedDir)
    val healthy = provider(newDir())
    commitVersion(healthy, 0, Map("warm" -> 1)) // the worker is up
    val worker = StateWorker.workerFor(0).get
    val e = expectThrows[Throwable]("the severed commit")(commitVersion(severed, 0, Map("a" -> 1)))
    val text = messages(e)
    check(text.contains("failed in transport") && text.contains("still answers") && text.contains("severed-store") &&
      text.contains(s"pid ${worker.pid}") && text.contains(worker.logFile.getPath), s"unclear transport error: $text")
    check(StateWorker.workerFor(0).get eq worker, "the worker must not be replaced for one transport error")
    check(commitVersion(healthy, 1, Map("other" -> 2)) == 2, "another store still commits")
    check(commitVersion(severed, 0, Map("a" -> 1)) == 1, "the retry of the severed store commits")
    check(contents(severed.getStore(1)) == Map(("a", 0) -> 1), "the retried version")
    severed.close(); healthy.close()
  }

  scenario("a_worker_of_another_release_is_refused") {
    val foreign = sys.env.getOrElse("PYSTATESTORE_TEST_FOREIGN_PYTHONPATH", "")
    check(foreign.nonEmpty, "tests/test_contract.py must set PYSTATESTORE_TEST_FOREIGN_PYTHONPATH")
    StateWorker.currentWorkers.foreach(_.process.destroyForcibly().waitFor())
    val p = provider(newDir(), conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.pythonPath" -> foreign))
    val s = p.getStore(0)
    s.put(key("a"), value(1))
    val e = expectThrows[Throwable]("commit through a worker of another release")(s.commit())
    val text = messages(e)
    check(text.contains("runs pystatestore 0.1.0 (protocol 1)") &&
      text.contains(s"this jar is pystatestore ${Release.Version} (protocol ${StateWorker.ProtocolVersion})") &&
      text.contains("pythonExec"), s"unclear refusal: $text")
    s.abort(); p.close()
    val good = provider(newDir())
    check(commitVersion(good, 0, Map("a" -> 1)) == 1, "a matching worker starts afterwards")
    good.close()
  }

  private val conf_ = "spark.sql.streaming.stateStore.pystatestore."

  /** Read views of this JVM whose directory name says they hold `version` (rocksdb backend). */
  def viewDirsOf(version: Long): Seq[String] =
    Option(StateWorker.viewsDir.list()).map(_.toSeq).getOrElse(Nil).filter(_.startsWith(s"v$version-"))

  scenario("reads_survive_pruning_maintenance_and_local_copy_cleanup") {
    val dir = newDir()
    val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "1", conf_ + "localRecoveryVersions" -> "1",
      "spark.sql.streaming.maxBatchesToRetainInMemory" -> "1", "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2")
    val p = provider(dir, conf = conf)
    val first = (1 to 500).map(i => s"k$i" -> i).toMap
    val others = viewDirsOf(1).toSet ++ (2 to 12).flatMap(v => viewDirsOf(v)) // of other scenarios
    commitVersion(p, 0, first)
    val reader = p.getReadStore(1) // a task still reading version 1 ...
    val open = reader.iterator()
    check(open.hasNext, "version 1 is empty")
    val views = viewDirsOf(1).filterNot(others)
    // ... while later versions are committed, version 1 leaves the cache, its checkpoint files are
    // collected and its local recovery copy is pruned.
    (2 to 12).foreach { v => commitVersion(p, v - 1, Map(s"n$v" -> v), Seq(s"k$v")); p.doMaintenance() }
    val storeDir = new File(new java.net.URI(dir).getPath, "0/0")
    check(!new File(storeDir, "manifests/1.json").exists(), "retention did not remove version 1")
    val rest = Iterator.continually(open).takeWhile(_.hasNext).map(_.next()).map(_.key.getUTF8String(0).toString)
    check(rest.size == 500, s"the open iterator lost rows: ${rest.size}")
    check(contents(reader) == first.map { case (k, v) => (k, 0) -> v }, "version 1 changed under its reader")
    if (backend == "rocksdb") check(views.nonEmpty && views.forall(v => viewDirsOf(1).contains(v)),
      s"the view of version 1 was removed while it was read: $views")
    reader.release()
    if (backend == "rocksdb") check(views.forall(v => !viewDirsOf(1).contains(v)), s"a released view stayed: $views")
    p.close()
    if (backend == "rocksdb") {
      val left = (1 to 12).flatMap(v => viewDirsOf(v)).filterNot(others)
      check(left.isEmpty, s"views left after the provider closed: $left")
    }
  }

  scenario("a_worker_killed_while_a_view_is_open") {
    val dir = newDir()
    val p = provider(dir)
    commitVersion(p, 0, (1 to 200).map(i => s"k$i" -> i).toMap)
    val s = p.getStore(1)
    check(intOf(s.get(key("k7"))).contains(7), "read before the kill")
    val worker = StateWorker.workerFor(0).get
    worker.process.destroyForcibly().waitFor()
    check(intOf(s.get(key("k8"))).contains(8), "a read after the worker died")
    check(contents(s).size == 200, "iteration after the worker died")
    s.put(key("new"), value(1)); s.remove(key("k1"))
    check(s.commit() == 2, "the commit after the worker died goes to a new worker")
    check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
    val got = contents(provider(dir).getStore(2))
    check(got.size == 200 && got.get(("new", 0)).contains(1) && !got.contains(("k1", 0)), s"version 2: ${got.size} keys")
    p.close()
  }

  scenario("every_layout_the_worker_writes_reads_back_in_the_jvm") {
    // An L0 trigger of 2 makes RocksDB compact all the time, so versions are made of flushed,
    // compacted and reused files; each must read back exactly through Spark's rocksdbjni.
    val dir = newDir()
    val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
    val conf = sqlConf(conf_ + "rocksdb.l0CompactionTrigger" -> "2", "spark.sql.streaming.minBatchesToRetain" -> "50")
    val p = provider(dir, encoder = spec, conf = conf)
    val rnd = new scala.util.Random(11)
    var model = Map.empty[(String, Int), Int]
    val versions = mutable.Map(0L -> model)
    for (v <- 1 to 25) {
      val s = p.getStore(v - 1)
      (1 to 120).foreach { _ =>
        val k = (s"g${rnd.nextInt(30)}", rnd.nextInt(20))
        if (rnd.nextInt(5) == 0) { s.remove(key(k._1, k._2)); model -= k }
        else { val x = rnd.nextInt(1000); s.put(key(k._1, k._2), value(x)); model += k -> x }
      }
      check(s.commit() == v, s"commit $v")
      check(s.metrics.numKeys == model.size, s"version $v counts ${s.metrics.numKeys} keys, expected ${model.size}")
      versions(v) = model
    }
    p.close()
    val fresh = provider(dir, encoder = spec, conf = conf)
    for (v <- 1L to 25L) {
      val store = fresh.getReadStore(v)
      check(contents(store) == versions(v), s"version $v reads back differently")
      val scanned = store.prefixScan(prefix("g3")).map(pr => (pr.key.getInt(1), pr.value.getInt(0))).toMap
      val expected = versions(v).collect { case (("g3", i), x) => i -> x }
      check(scanned == expected, s"prefix scan of version $v: $scanned != $expected")
      store.release()
    }
    fresh.close()
  }

  scenario("key_counts_come_from_spark_reads_not_lookups") {
    val p = provider(newDir())
    commitVersion(p, 0, Map("a" -> 1, "b" -> 2, "c" -> 3))
    // Spark's aggregation: a read store is upgraded first, then every key is read, then written.
    val read = p.getReadStore(1)
    val write = p.upgradeReadStoreToWriteStore(read, 1, None)
    for (k <- Seq("a", "x", "y")) { read.get(key(k)); write.put(key(k), value(9)) }
    write.get(key("b")); write.remove(key("b")) // read, then removed
    write.remove(key("zz")) // removing a key that never existed: not counted
    write.put(key("c"), value(30)) // written without a read: looked up at commit
    check(write.commit() == 2, "commit")
    val m = write.metrics
    check(m.numKeys == 4, s"numKeys ${m.numKeys}, expected 4 (a c x y)")
    val looked = m.customMetrics.collectFirst { case (k, v) if k.name == "pystatestoreKeysLookedUpAtCommit" => v }
    check(looked.contains(2L), s"keys looked up at commit: $looked, expected 2 (c and zz, written unread)")
    read.release(); write.release()
    check(contents(provider(p.stateStoreId.checkpointRootLocation).getStore(2)).keySet ==
      Set(("a", 0), ("c", 0), ("x", 0), ("y", 0)), "version 2")
    p.close()
  }

  def main(args: Array[String]): Unit = {
    workDir = new File(args(0)).toPath
    pythonExec = args(1)
    pythonPath = args(2)
    // "rocksdb", "memory", or a backend and its commit mode: "rocksdb:snapshot"
    backend = args(3).split(":")(0)
    commitMode = args(3).split(":").lift(1).getOrElse("")
    val only = args.drop(4).toSet
    MinorScenarios.register() // tests/jvm/spark-*/: what only this Spark minor's API has
    Files.createDirectories(workDir)
    val spark = SparkSession.builder().master("local[2]").appName("pystatestore-contract")
      .config("spark.ui.enabled", "false").getOrCreate()
    var failures = 0
    try {
      for ((name, body) <- scenarios if only.isEmpty || only(name)) {
        val started = System.nanoTime()
        def elapsed: String = s"${(System.nanoTime() - started) / 1000000}ms"
        try {
          body()
          println(s"PASS $name $elapsed")
        } catch {
          case NonFatal(e) =>
            failures += 1
            val detail = e match {
              case c: Check => c.getMessage
              case other => s"${other.getClass.getName}: ${messages(other)}"
            }
            println(s"FAIL $name $elapsed: ${detail.replace('\n', ' ')}")
        }
        Console.out.flush()
      }
    } finally spark.stop()
    println(s"CONTRACT DONE failures=$failures")
    sys.exit(if (failures == 0) 0 else 1)
  }
}
