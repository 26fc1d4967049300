package org.pystatestore.tests

import java.nio.file.{Files, Path}
import java.util.concurrent.TimeUnit

import scala.collection.mutable

import org.apache.hadoop.conf.Configuration

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

import org.pystatestore.PythonStateStoreProvider

/**
 * What every contract scenario shares (tests/jvm/Contract*.scala and the spark-MINOR directories):
 * the scenario registry, the store's schemas and rows, providers configured for the backend under
 * test, and the checks. ContractSuite runs the registered scenarios.
 */
object ContractHarness {
  val keySchema: StructType = StructType(Seq(StructField("k", StringType), StructField("i", IntegerType)))
  val valueSchema: StructType = StructType(Seq(StructField("v", IntegerType)))
  private val keyProj = UnsafeProjection.create(keySchema)
  private val valueProj = UnsafeProjection.create(valueSchema)
  private val prefixProj = UnsafeProjection.create(StructType(Seq(StructField("k", StringType))))

  /** The backend every scenario runs on: rocksdb, committing changelogs (what users get unset). */
  val DefaultBackend = "rocksdb"

  private var work: Path = _
  private var pythonExec: String = _
  private var pythonPath: String = _
  private var backendName: String = DefaultBackend
  /** The rocksdb backend's commit mode ("" leaves the default). */
  private var mode: String = ""

  /** Where scenarios make their stores; the python and the package path their workers run. */
  def configure(workDir: Path, python: String, packagePath: String): Unit = {
    work = workDir; pythonExec = python; pythonPath = packagePath
  }
  /** "rocksdb", "memory", or a backend and its commit mode: "rocksdb:snapshot". */
  def useBackend(spec: String): Unit = {
    backendName = spec.split(":")(0)
    mode = spec.split(":").lift(1).getOrElse("")
  }
  def workDir: Path = work
  def backend: String = backendName
  def commitMode: String = mode
  /** Whether versions are committed as changelogs (the rocksdb backend's default mode). */
  def changelogCommits: Boolean = backend == "rocksdb" && commitMode != "snapshot"

  /**
   * The backends a scenario runs on, which each scenario names: every behaviour once rather than
   * every combination (issue 83). The default backend runs every scenario; the others, those that
   * go through what they do differently. Mirrored by tests/test_contract.py's REACH.
   */
  sealed abstract class Reach(val runsOn: String => Boolean)
  /**
   * Goes through what differs between backends and commit modes: the commit, loads and reloads of
   * older versions, reads of committed versions, maintenance and GC, attempts, key counts.
   */
  case object EveryBackend extends Reach(_ => true)
  /** As EveryBackend, for what only the rocksdb backend has (column families) or reads (layouts). */
  case object BothCommitModes extends Reach(_.startsWith("rocksdb"))
  /**
   * The JVM's own machinery, the same whatever stores the versions: the write buffer, the worker
   * pool and its failures, what the shim refuses, Spark's API adapters.
   */
  case object DefaultBackendOnly extends Reach(_ == DefaultBackend)

  final case class Scenario(name: String, reach: Reach, run: () => Unit)
  private val scenarios = mutable.LinkedHashMap.empty[String, Scenario]
  def scenario(name: String, reach: Reach)(body: => Unit): Unit = {
    require(!scenarios.contains(name), s"two scenarios are named $name")
    scenarios(name) = Scenario(name, reach, () => body)
  }
  /** The scenarios in the order they were registered. */
  def registered: Seq[Scenario] = scenarios.values.toSeq

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

  val ConfPrefix = "spark.sql.streaming.stateStore.pystatestore."

  def sqlConf(extra: (String, String)*): SQLConf = {
    val c = new SQLConf()
    c.setConfString(ConfPrefix + "pythonExec", pythonExec)
    c.setConfString(ConfPrefix + "pythonPath", pythonPath)
    c.setConfString(ConfPrefix + "backend", backend)
    if (commitMode.nonEmpty) c.setConfString(ConfPrefix + "commitMode", commitMode)
    extra.foreach { case (k, v) => c.setConfString(k, v) }
    c
  }

  /** Two batches retained, a snapshot every 2 versions, orphans kept 10 s: maintenance has work soon. */
  def retainTwoConf(): SQLConf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "2",
    "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
    ConfPrefix + "orphanGraceSeconds" -> "10")

  /** The manifest names of partition 0's store of operator 0 under the checkpoint `dir`, sorted. */
  def manifestsIn(dir: String): Seq[String] =
    new java.io.File(new java.net.URI(dir).getPath, "0/0/manifests").list().sorted.toSeq

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
}
