package org.pystatestore

import java.io.{File, FileInputStream, FileOutputStream}
import java.nio.channels.Channels

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

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

  /**
   * Writes a change frame to `file`: `emit` is handed a writer of puts and deletes taking byte
   * slices (so rows are copied straight from the write buffer's pages). Returns the bytes written.
   */
  def writeChanges(file: File)(emit: ChangeWriter => Unit): Long = try writeChangesTo(file, emit) catch {
    case e: java.io.IOException => throw localWriteFailed(file, e)
  }

  /** A change frame that could not be written on this host's disk, said so with what to do. */
  private def localWriteFailed(file: File, e: java.io.IOException): java.io.IOException = {
    val reason = Option(e.getMessage).getOrElse(e.toString)
    val todo = if (reason.contains("No space left") || reason.contains("quota")) {
      "this host's local work directory is full: free space there, or set spark.local.dir to a directory on a " +
        "larger disk"
    } else "set spark.local.dir to a directory this user can write, on a local disk"
    new java.io.IOException(s"pystatestore could not write the change frame $file ($reason): $todo.", e)
  }

  private def writeChangesTo(file: File, emit: ChangeWriter => Unit): Long = {
    val root = VectorSchemaRoot.create(changeSchema, allocator)
    val out = try new FileOutputStream(file) catch { case NonFatal(e) => root.close(); throw e }
    try {
      val writer = new ArrowStreamWriter(root, null, Channels.newChannel(out))
      writer.start()
      val changes = new ChangeWriter(root, writer)
      emit(changes)
      changes.flush()
      writer.end()
      writer.close()
      file.length()
    } finally {
      root.close()
      out.close()
    }
  }

  /**
   * Writes a one-row change frame to nowhere: loads and initializes Arrow's allocator and IPC
   * writer, which cost a fresh JVM about a second the first time (StateWorker.prestart).
   */
  def warmUp(): Unit = {
    val root = VectorSchemaRoot.create(changeSchema, allocator)
    try {
      val writer = new ArrowStreamWriter(root, null, Channels.newChannel(java.io.OutputStream.nullOutputStream()))
      writer.start()
      val changes = new ChangeWriter(root, writer)
      changes.put(Array[Byte](0), 0, 1, Array[Byte](0), 0, 1)
      changes.flush()
      writer.end()
      writer.close()
    } finally root.close()
  }

  /** Appends changes to a change frame in batches of `BatchRows`. */
  final class ChangeWriter private[ArrowFrames] (root: VectorSchemaRoot, writer: ArrowStreamWriter) {
    private val ops = root.getVector("op").asInstanceOf[TinyIntVector]
    private val keys = root.getVector("key").asInstanceOf[VarBinaryVector]
    private val values = root.getVector("value").asInstanceOf[VarBinaryVector]
    private var rows = 0
    root.allocateNew()

    def put(key: Array[Byte], keyOffset: Int, keyLength: Int,
        value: Array[Byte], valueOffset: Int, valueLength: Int): Unit = {
      ops.setSafe(rows, OpPut.toInt)
      keys.setSafe(rows, key, keyOffset, keyLength)
      values.setSafe(rows, value, valueOffset, valueLength)
      advance()
    }

    def delete(key: Array[Byte], keyOffset: Int, keyLength: Int): Unit = {
      ops.setSafe(rows, OpDelete.toInt)
      keys.setSafe(rows, key, keyOffset, keyLength)
      values.setNull(rows)
      advance()
    }

    private def advance(): Unit = {
      rows += 1
      if (rows == BatchRows) flush()
    }

    private[ArrowFrames] def flush(): Unit = if (rows > 0) {
      root.setRowCount(rows)
      writer.writeBatch()
      root.allocateNew()
      rows = 0
    }
  }

  /** One row of a change feed frame; `value` is null for deletes. */
  final case class FeedRow(version: Long, op: Byte, key: Array[Byte], value: Array[Byte])

  /**
   * The rows of a change feed frame (version, op, key, value), read a batch at a time. `close()`
   * frees the reader; the caller deletes the file.
   */
  final class ChangeFeedReader(file: File) extends Iterator[FeedRow] with AutoCloseable {
    private val in = new FileInputStream(file)
    private val reader = new ArrowStreamReader(in, allocator)
    private val root = reader.getVectorSchemaRoot
    private var row = 0
    private var rows = 0
    private var finished = false

    override def hasNext: Boolean = {
      while (!finished && row >= rows) {
        if (reader.loadNextBatch()) { row = 0; rows = root.getRowCount }
        else finished = true
      }
      !finished
    }

    override def next(): FeedRow = {
      if (!hasNext) throw new NoSuchElementException("end of the change feed")
      val versions = root.getVector("version").asInstanceOf[org.apache.arrow.vector.BigIntVector]
      val ops = root.getVector("op").asInstanceOf[TinyIntVector]
      val keys = root.getVector("key").asInstanceOf[VarBinaryVector]
      val values = root.getVector("value").asInstanceOf[VarBinaryVector]
      val out = FeedRow(versions.get(row), ops.get(row), keys.get(row),
        if (values.isNull(row)) null else values.get(row))
      row += 1
      out
    }

    override def close(): Unit = {
      finished = true
      try reader.close() finally in.close()
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
