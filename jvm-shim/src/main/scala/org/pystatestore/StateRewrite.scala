package org.pystatestore

import java.util.UUID

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.Row
import org.apache.spark.sql.classic.{Dataset, SparkSession}
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow, XXH64}
import org.apache.spark.sql.execution.streaming.state.{KeyStateEncoderSpec, NoPrefixKeyStateEncoderSpec, PrefixKeyScanStateEncoderSpec, StateStoreConf, StateStoreId, StateStoreProvider, StateStoreProviderId}
import org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types.{DataType, StructType}

/**
 * The JVM half of `pystatestore migrate` and `repartition`. Where the target is Spark's HDFS or
 * RocksDB provider, writes a store's whole state through that provider's public StateStoreProvider
 * API, so its files are written by its own code. Where the target is ours and the source Spark's,
 * exports each source store's state, as read by Spark's state reader, as the bytes our store keeps;
 * Python then writes our stores. Python plans the rewrite, reads the state with Spark's state data
 * source, places keys and moves files; this object only converts rows, opens providers, puts rows
 * and commits.
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
   * state of store partition i, the provider's own first version (`getStore(0)`, committed as
   * version 1: the only version any provider can be asked to write with no earlier one); the
   * summaries count the misplaced rows, so the caller can refuse the result before anything is
   * published. Returns one JSON summary per partition, in partition order.
   */
  def write(rows: Dataset[Row], numPartitions: Int, s: StoreSpec): java.util.List[String] = {
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
        val store = provider.getStore(0L)
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
   * Writes partition i of `rows` (Spark's state reader over the source: columns `key` and `value`,
   * structs of the store's schemas, and `partition_id`) to `<dir>/source-<i>.arrow` as a change
   * frame of puts whose key and value bytes are what our store keeps: the value row, and the key
   * row laid out as `keyEncoding` (KeyCodec) says. A target that is ours is then written by the
   * worker's own backend code in Python, with no provider opened here. Returns one JSON summary
   * (partition, rows, file) per partition, in partition order.
   */
  def export(rows: Dataset[Row], numPartitions: Int, s: StoreSpec, keyEncoding: String,
      dir: String): java.util.List[String] = {
    val rdd = rows.select("key", "value", "partition_id").queryExecution.toRdd
    if (rdd.getNumPartitions != numPartitions) {
      throw new IllegalStateException(s"pystatestore rewrite of operator ${s.operatorId} store ${s.storeName}: " +
        s"the state reader gives ${rdd.getNumPartitions} partitions, not the checkpoint's $numPartitions")
    }
    val codec: KeyCodec = keyEncoding match {
      case KeyCodec.Raw => new RawKeys(s.keySchema.length)
      case KeyCodec.Prefix if s.numColsPrefixKey > 0 =>
        new PrefixKeys(new PrefixKeySpec(s.keySchema, s.numColsPrefixKey), s.keySchema.length)
      case other => throw new IllegalArgumentException(s"pystatestore rewrite of operator ${s.operatorId} " +
        s"store ${s.storeName}: no key encoding '$other' for a key with ${s.numColsPrefixKey} prefix columns")
    }
    val numKeyFields = s.keySchema.length
    val numValueFields = s.valueSchema.length
    rdd.mapPartitionsWithIndex { (partition, it) =>
      val keyProj = UnsafeProjection.create(s.keySchema)
      val valueProj = UnsafeProjection.create(s.valueSchema)
      val file = new java.io.File(dir, s"source-$partition.arrow")
      var count = 0L
      ArrowFrames.writeChanges(file) { out =>
        it.foreach { row =>
          if (row.getInt(2) != partition) {
            throw new IllegalStateException(s"pystatestore rewrite of operator ${s.operatorId} store " +
              s"${s.storeName}: the state reader gave partition ${row.getInt(2)}'s rows in partition $partition")
          }
          val key = codec.encode(keyProj(row.getStruct(0, numKeyFields)))
          val value = valueProj(row.getStruct(1, numValueFields)).getBytes
          out.put(key, 0, key.length, value, 0, value.length)
          count += 1
        }
      }
      Iterator(s"""{"partition":$partition,"rows":$count,"file":"${file.getName}"}""")
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
