package org.pystatestore

import java.util.UUID

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.Row
import org.apache.spark.sql.classic.{Dataset, SparkSession}
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow, XXH64}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, StateStore, StateStoreConf, StateStoreId, StateStoreProvider, StateStoreProviderId}
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{DataType, StructType}

/**
 * The JVM half of `pystatestore migrate` and `repartition`: writes a store's whole state through
 * the public StateStoreProvider API of whichever provider the rewritten checkpoint names (Spark's
 * HDFS or RocksDB provider, or ours), so every provider's files are written by its own code. Python
 * plans the rewrite, reads the state with Spark's state data source, places each key in its
 * partition and moves files; this object only opens providers, puts rows and commits.
 *
 * Each partition is summarised as rows and an order-independent digest of the stored key and value
 * bytes, the same on the write and on the read-back, so the rewrite can check every store it wrote
 * against what it meant to write before declaring the new checkpoint complete.
 */
object StateRewrite {

  /** One store kind of an operator, as the rewrite writes and reads it. */
  final case class StoreSpec(
      stateRoot: String,
      operatorId: Long,
      storeName: String,
      keySchema: StructType,
      valueSchema: StructType,
      numColsPrefixKey: Int,
      conf: Map[String, String]) {
    def encoderSpec: KeyStateEncoderSpec =
      if (numColsPrefixKey > 0) PrefixKeyScanStateEncoderSpec(keySchema, numColsPrefixKey)
      else NoPrefixKeyStateEncoderSpec(keySchema)
  }

  /** The spec `write` and `readBack` take, from what Python has: schemas as JSON, confs as a map. */
  def storeSpec(
      stateRoot: String,
      operatorId: Long,
      storeName: String,
      keySchemaJson: String,
      valueSchemaJson: String,
      numColsPrefixKey: Int,
      conf: java.util.Map[String, String]): StoreSpec =
    StoreSpec(stateRoot, operatorId, storeName, DataType.fromJson(keySchemaJson).asInstanceOf[StructType],
      DataType.fromJson(valueSchemaJson).asInstanceOf[StructType], numColsPrefixKey, conf.asScala.toMap)

  /** The store conf a query running with `conf` (its offset log's SQL confs) gives its providers. */
  private def storeConf(conf: Map[String, String]): StateStoreConf = {
    val sqlConf = SQLConf.get.clone()
    conf.foreach { case (k, v) => sqlConf.setConfString(k, v) }
    new StateStoreConf(sqlConf, Map.empty)
  }

  private def openProvider(s: StoreSpec, partition: Int, conf: StateStoreConf,
      hadoopConf: org.apache.hadoop.conf.Configuration): StateStoreProvider = {
    val id = StateStoreProviderId(StateStoreId(s.stateRoot, s.operatorId, partition, s.storeName), UUID.randomUUID())
    StateStoreProvider.createAndInit(id, s.keySchema, s.valueSchema, s.encoderSpec, useColumnFamilies = false,
      conf, hadoopConf, useMultipleValuesPerKey = false, stateSchemaProvider = None)
  }

  /** Adds one stored pair to a running digest: order-independent, so write and read-back agree. */
  private def pairHash(key: UnsafeRow, value: UnsafeRow): Long = {
    val k = XXH64.hashUnsafeBytes(key.getBaseObject, key.getBaseOffset, key.getSizeInBytes, 42L)
    XXH64.hashUnsafeBytes(value.getBaseObject, value.getBaseOffset, value.getSizeInBytes, k)
  }

  private def summary(partition: Int, rows: Long, digest: Long, version: Long, misplaced: Long = 0L): String =
    s"""{"partition":$partition,"rows":$rows,"digest":"${java.lang.Long.toHexString(digest)}",""" +
      s""""version":$version,"misplaced":$misplaced}"""

  /**
   * Writes partition i of `rows` (columns `key` and `value`, structs of the store's schemas, and
   * `misplaced`, true for a row the source did not hold where Spark's hash puts it) as the whole
   * state of store partition i; the summaries count the misplaced rows, so the caller can refuse
   * the result before anything is published. `baseVersion` 0: the provider's own first version (any
   * provider; the commit is version 1). Above 0: our provider's empty store at `baseVersion`, so
   * the commit is `baseVersion + 1` and needs no earlier version. Returns one JSON summary per
   * partition, in partition order.
   */
  def write(rows: Dataset[Row], numPartitions: Int, s: StoreSpec, baseVersion: Long): java.util.List[String] = {
    val rdd = rows.select("key", "value", "misplaced").queryExecution.toRdd
    if (rdd.getNumPartitions != numPartitions) {
      throw new IllegalStateException(s"pystatestore rewrite of operator ${s.operatorId} store ${s.storeName}: " +
        s"the rows come in ${rdd.getNumPartitions} partitions, not $numPartitions (adaptive query execution must be off)")
    }
    val hadoopConf = SparkInternals.serializable(rows.sparkSession.sessionState.newHadoopConf())
    val conf0 = storeConf(s.conf)
    val numKeyFields = s.keySchema.length
    val numValueFields = s.valueSchema.length
    rdd.mapPartitionsWithIndex { (partition, it) =>
      val provider = openProvider(s, partition, conf0, hadoopConf())
      try {
        val store: StateStore = provider match {
          case ours: PythonStateStoreProviderCore if baseVersion > 0 => ours.openEmptyWriteStore(baseVersion, false)
          case _ if baseVersion > 0 =>
            throw new IllegalArgumentException(s"only pystatestore opens an empty store at version $baseVersion; " +
              s"${provider.getClass.getName} writes version 1")
          case other => other.getStore(0L)
        }
        val keyProj = UnsafeProjection.create(s.keySchema)
        val valueProj = UnsafeProjection.create(s.valueSchema)
        var count = 0L
        var digest = 0L
        var misplaced = 0L
        try {
          it.foreach { row =>
            val key = keyProj(row.getStruct(0, numKeyFields))
            val value = valueProj(row.getStruct(1, numValueFields))
            digest += pairHash(key, value)
            count += 1
            if (row.getBoolean(2)) misplaced += 1
            store.put(key, value) // every provider copies or encodes what it keeps
          }
          val version = store.commit()
          Iterator(summary(partition, count, digest, version, misplaced))
        } finally {
          if (!store.hasCommitted) store.abort()
        }
      } finally provider.close()
    }.collect().toList.asJava
  }

  /**
   * Reads `version` of store partitions 0 until `numPartitions` back through the provider `conf`
   * names, summarised as `write` summarises what it wrote.
   */
  def readBack(spark: SparkSession, numPartitions: Int, s: StoreSpec, version: Long): java.util.List[String] = {
    val hadoopConf = SparkInternals.serializable(spark.sessionState.newHadoopConf())
    val conf0 = storeConf(s.conf)
    spark.sparkContext.parallelize(0 until numPartitions, numPartitions).map { partition =>
      val provider = openProvider(s, partition, conf0, hadoopConf())
      try {
        val store = provider.getReadStore(version)
        try {
          var count = 0L
          var digest = 0L
          store.iterator().foreach { pair =>
            digest += pairHash(pair.key, pair.value)
            count += 1
          }
          summary(partition, count, digest, version)
        } finally store.abort()
      } finally provider.close()
    }.collect().toList.asJava
  }

}
