package org.pystatestore

import java.io.{File, FileInputStream, FileOutputStream}
import java.nio.channels.Channels

import scala.jdk.CollectionConverters._

import org.apache.arrow.memory.{BufferAllocator, RootAllocator}
import org.apache.arrow.vector.{TinyIntVector, VarBinaryVector, VectorSchemaRoot}
import org.apache.arrow.vector.ipc.{ArrowStreamReader, ArrowStreamWriter}
import org.apache.arrow.vector.types.pojo.{ArrowType, Field, Schema}

/**
 * The data plane (DESIGN §2): Arrow IPC streams exchanged as files in the worker's exchange dir.
 * Schemas are fixed and documented in docs/ARCHITECTURE.md:
 *   changes: op int8 (1 = put, 2 = delete), key binary, value binary (null for deletes)
 *   state:   key binary, value binary
 */
object ArrowFrames {
  val OpPut: Byte = 1
  val OpDelete: Byte = 2
  private val BatchRows = 32768

  lazy val allocator: BufferAllocator = new RootAllocator(Long.MaxValue)

  private val changeSchema = new Schema(Seq(
    Field.nullable("op", new ArrowType.Int(8, true)),
    Field.nullable("key", ArrowType.Binary.INSTANCE),
    Field.nullable("value", ArrowType.Binary.INSTANCE)).asJava)

  /** Writes (op, key, value) triples; returns the number of bytes written. */
  def writeChanges(file: File, changes: Iterator[(Byte, Array[Byte], Array[Byte])]): Long = {
    val root = VectorSchemaRoot.create(changeSchema, allocator)
    val out = new FileOutputStream(file)
    try {
      val writer = new ArrowStreamWriter(root, null, Channels.newChannel(out))
      val ops = root.getVector("op").asInstanceOf[TinyIntVector]
      val keys = root.getVector("key").asInstanceOf[VarBinaryVector]
      val values = root.getVector("value").asInstanceOf[VarBinaryVector]
      writer.start()
      var rows = 0
      def flush(): Unit = {
        root.setRowCount(rows)
        writer.writeBatch()
        root.allocateNew()
        rows = 0
      }
      root.allocateNew()
      changes.foreach { case (op, key, value) =>
        ops.setSafe(rows, op.toInt)
        keys.setSafe(rows, key)
        if (value == null) values.setNull(rows) else values.setSafe(rows, value)
        rows += 1
        if (rows == BatchRows) flush()
      }
      if (rows > 0) flush()
      writer.end()
      writer.close()
      file.length()
    } finally {
      root.close()
      out.close()
    }
  }

  /** Streams (key, value) pairs of a state frame to `consume`; returns the pair count. */
  def readState(file: File)(consume: (Array[Byte], Array[Byte]) => Unit): Long = {
    val in = new FileInputStream(file)
    val reader = new ArrowStreamReader(in, allocator)
    try {
      val root = reader.getVectorSchemaRoot
      var count = 0L
      while (reader.loadNextBatch()) {
        val keys = root.getVector("key").asInstanceOf[VarBinaryVector]
        val values = root.getVector("value").asInstanceOf[VarBinaryVector]
        var i = 0
        val n = root.getRowCount
        while (i < n) {
          consume(keys.get(i), values.get(i))
          i += 1
        }
        count += n
      }
      count
    } finally {
      reader.close()
      in.close()
    }
  }
}
