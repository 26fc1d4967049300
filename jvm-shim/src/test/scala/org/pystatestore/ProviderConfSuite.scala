package org.pystatestore

import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.json4s.JString
import org.scalatest.funsuite.AnyFunSuite

import org.pystatestore.TestRows._

/**
 * The provider's confs as a store reads them (ProviderConf, WorkerLaunchSpec) and the layouts it
 * refuses at init (StoreChecks): each value that is not usable is refused naming the conf.
 */
class ProviderConfSuite extends AnyFunSuite {
  private val Prefix = WorkerLaunchSpec.ConfPrefix

  private def storeConf(settings: (String, String)*): StateStoreConf = {
    val sql = new SQLConf()
    settings.foreach { case (k, v) => sql.setConfString(k, v) }
    new StateStoreConf(sql)
  }

  test("the JVM block cache: 32 MiB unless set; a value that is not a positive number of MiB is refused naming it") {
    assert(ProviderConf.jvmBlockCacheMB(storeConf()) == RocksViews.DefaultBlockCacheMB)
    assert(ProviderConf.jvmBlockCacheMB(storeConf(Prefix + "jvmBlockCacheMB" -> " 64 ")) == 64L)
    for (bad <- Seq("0", "-3", "lots", "1.5", "")) {
      val e = intercept[IllegalArgumentException](
        ProviderConf.jvmBlockCacheMB(storeConf(Prefix + "jvmBlockCacheMB" -> bad)))
      assert(e.getMessage == s"${Prefix}jvmBlockCacheMB=$bad is not a positive number of MiB; fix or unset it")
    }
  }

  test("the backend, the versions kept in memory, the lag Spark's coordinator logs at, and the worker's options") {
    assert(ProviderConf.usesViews(storeConf()) && ProviderConf.usesViews(storeConf(Prefix + "backend" -> "rocksdb")))
    assert(!ProviderConf.usesViews(storeConf(Prefix + "backend" -> "memory")))
    assert(ProviderConf.versionsInMemory(storeConf("spark.sql.streaming.maxBatchesToRetainInMemory" -> "0")) == 1)
    assert(ProviderConf.versionsInMemory(storeConf("spark.sql.streaming.maxBatchesToRetainInMemory" -> "3")) == 3)
    val minDeltas = "spark.sql.streaming.stateStore.minDeltasForSnapshot"
    assert(ProviderConf.laggingAfterVersions(storeConf(minDeltas -> "4")) == 20L) // Spark's multiplier: 5
    assert(ProviderConf.laggingAfterVersions(storeConf(minDeltas -> "4",
      "spark.sql.streaming.stateStore.multiplierForMinVersionDiffToLog" -> "3")) == 12L)
    val options = ProviderConf.workerOptions(storeConf(Prefix + "backend" -> "rocksdb",
      Prefix + "rocksdb.l0CompactionTrigger" -> "2", "spark.sql.streaming.stateStore.compression.codec" -> "zstd"))
    assert(options.toMap == Map("backend" -> JString("rocksdb"), "rocksdb.l0CompactionTrigger" -> JString("2")))
  }

  test("the worker's launch: the interpreter's conf and where it came from; bad counts and timeouts refused") {
    val spec = WorkerLaunchSpec.resolve(Map(Prefix + "pythonExec" -> "/opt/py/bin/python3", Prefix + "pythonPath" -> "",
      Prefix + "workers" -> " 3 ", Prefix + "callTimeoutMs" -> "5000"))
    assert(spec.pythonExec == "/opt/py/bin/python3" && spec.pythonExecFrom == Prefix + "pythonExec")
    assert(spec.pythonPath.isEmpty && spec.workers == 3 && spec.callTimeoutMs == 5000L && spec.startTimeoutMs == 60000L)
    val byDefault = WorkerLaunchSpec.resolve(Map.empty).workers // no SparkEnv: the cores, at most 4
    val cores = Runtime.getRuntime.availableProcessors()
    assert(byDefault >= 1 && byDefault <= math.min(WorkerLaunchSpec.MaxDefaultWorkers, cores))
    for (bad <- Seq("0", "65", "two")) {
      val e = intercept[IllegalArgumentException](WorkerLaunchSpec.resolve(Map(Prefix + "workers" -> bad)))
      assert(e.getMessage ==
        s"${Prefix}workers=$bad is not a number of Python workers per JVM from 1 to 64; fix or unset it")
    }
    for (name <- Seq("workerStartTimeoutMs", "callTimeoutMs", "workerProbeIntervalMs"); bad <- Seq("0", "-1", "soon")) {
      val e = intercept[IllegalArgumentException](WorkerLaunchSpec.resolve(Map(Prefix + name -> bad)))
      assert(e.getMessage == s"$Prefix$name=$bad is not a positive number of milliseconds; fix or unset it")
    }
  }

  test("layouts refused at init name the store and what to set; the supported ones pass") {
    val store = StateStoreId("/checkpoint/state", 0, 3)
    def refusal(cf: Boolean, multi: Boolean, views: Boolean, format: String): String = intercept[Exception](
      StoreChecks.layoutSupported(store, cf, multi, views, format)).getMessage
    assert(refusal(cf = true, multi = false, views = false, "unsaferow")
      .contains(s"(store $store); column families need ${Prefix}backend=rocksdb"))
    assert(refusal(cf = true, multi = true, views = true, "Avro").contains(
      "set spark.sql.streaming.stateStore.encodingFormat=unsaferow (the default) before the query's first batch"))
    assert(refusal(cf = false, multi = true, views = true, "unsaferow").contains(
      s"keeps multiple values per key only in column families (store $store)"))
    for (cf <- Seq(false, true); views <- Seq(true, false) if views || !cf) {
      StoreChecks.layoutSupported(store, cf, useMultipleValuesPerKey = cf, views, "unsaferow")
    }
  }

  test("key encoders: prefix scans give their prefix, no prefix none, and a range-scan store is refused") {
    val store = StateStoreId("/checkpoint/state", 1, 0)
    val prefixed = StoreChecks.keyEncoderPrefix(store, keySchema, PrefixKeyScanStateEncoderSpec(keySchema, 1))
    assert(prefixed.map(_.numColsPrefixKey) == Some(1))
    assert(StoreChecks.keyEncoderPrefix(store, keySchema, NoPrefixKeyStateEncoderSpec(keySchema)).isEmpty)
    val range = RangeKeyScanStateEncoderSpec(keySchema, Seq(1))
    val e = intercept[Exception](StoreChecks.keyEncoderPrefix(store, keySchema, range))
    assert(e.getMessage.contains(s"does not support RangeKeyScanStateEncoderSpec yet (store $store)"), e.getMessage)
  }
}
