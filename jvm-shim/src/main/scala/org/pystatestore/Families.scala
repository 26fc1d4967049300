package org.pystatestore

import java.nio.ByteBuffer

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/** What Spark declared of a column family (`createColFamilyIfAbsent`, or the store's own at init). */
final case class FamilySpec(
    name: String,
    keySchema: StructType,
    valueSchema: StructType,
    encoder: KeyStateEncoderSpec,
    multipleValues: Boolean) {

  /** The family's key encoding without its id: Spark's encoder spec, as this store lays keys out. */
  def innerCodec: KeyCodec = encoder match {
    case NoPrefixKeyStateEncoderSpec(_) => new RawKeys(keySchema.length)
    case PrefixKeyScanStateEncoderSpec(_, n) => new PrefixKeys(new PrefixKeySpec(keySchema, n), keySchema.length)
    case RangeKeyScanStateEncoderSpec(_, ordinals) => new RangeKeys(keySchema, ordinals)
    case other => throw new IllegalArgumentException(s"key encoder ${other.getClass.getSimpleName}")
  }

  def codec(id: Int): FamilyKeys = new FamilyKeys(id, innerCodec)
}

/**
 * The registry of a store's column families, kept in the store itself as family 0: name -> (id,
 * key encoding, multiple values, key and value schema as JSON). It is committed, restored, copied
 * and collected with the state, so a family keeps its id for the life of the checkpoint whatever
 * order Spark declares families in, and the offline tools can name each family's rows.
 */
object FamilyRegistry {
  val Id = 0
  val FirstFamilyId = 1
  private val keySchema = StructType(Seq(StructField("name", StringType, nullable = false)))
  private val valueSchema = StructType(Seq(
    StructField("id", IntegerType, nullable = false),
    StructField("keyEncoding", StringType, nullable = false),
    StructField("multipleValues", BooleanType, nullable = false),
    StructField("keySchema", StringType, nullable = false),
    StructField("valueSchema", StringType, nullable = false)))
  val codec: FamilyKeys = new FamilyKeys(Id, new RawKeys(1))
  val numValueFields: Int = valueSchema.length

  def keyRow(name: String): UnsafeRow =
    UnsafeProjection.create(keySchema).apply(InternalRow(UTF8String.fromString(name))).copy()

  def valueRow(id: Int, spec: FamilySpec): UnsafeRow =
    UnsafeProjection.create(valueSchema).apply(InternalRow(
      id,
      UTF8String.fromString(spec.innerCodec.name),
      spec.multipleValues,
      UTF8String.fromString(spec.keySchema.json),
      UTF8String.fromString(spec.valueSchema.json))).copy()

  /** name -> id of every family in `version`. */
  def read(version: CommittedVersion): Map[String, Int] = {
    val it = version.family(codec, numValueFields).pairs()
    try it.map { case (k, v) => k.getUTF8String(0).toString -> v.getInt(0) }.toMap finally it.close()
  }
}

/**
 * Several values per key (`merge`, `putList`, `valuesIterator`): stored as one value, each row
 * as a 4-byte big-endian length and its bytes. The write buffer and RocksDB carry it as an opaque
 * row; only these functions look inside.
 */
object ValueLists {
  def encode(values: Iterable[UnsafeRow]): UnsafeRow = {
    val size = values.iterator.map(4 + _.getSizeInBytes).sum
    val out = ByteBuffer.allocate(size)
    values.foreach { v => out.putInt(v.getSizeInBytes); v.writeTo(out) }
    carrier(out.array())
  }

  def append(existing: UnsafeRow, values: Iterable[UnsafeRow]): UnsafeRow =
    if (existing == null) encode(values) else {
      val more = encode(values)
      val out = new Array[Byte](existing.getSizeInBytes + more.getSizeInBytes)
      existing.writeToMemory(out, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET)
      more.writeToMemory(out, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + existing.getSizeInBytes)
      carrier(out)
    }

  def decode(list: UnsafeRow, numValueFields: Int): Iterator[UnsafeRow] =
    if (list == null) Iterator.empty else {
      val bytes = list.getBytes
      val buf = ByteBuffer.wrap(bytes)
      new Iterator[UnsafeRow] {
        override def hasNext: Boolean = buf.remaining() > 0
        override def next(): UnsafeRow = {
          if (buf.remaining() < 4) throw new IllegalStateException("a damaged list of values (cut short)")
          val length = buf.getInt()
          if (length < 0 || length > buf.remaining()) {
            throw new IllegalStateException(s"a damaged list of values (a value of $length bytes)")
          }
          val at = buf.position()
          buf.position(at + length)
          KeyCodec.row(bytes, at, length, numValueFields)
        }
      }
    }

  /** An UnsafeRow object over `bytes`, only to carry them through the buffer and views. */
  private def carrier(bytes: Array[Byte]): UnsafeRow = KeyCodec.row(bytes, 0, bytes.length, 1)
}

/** One family as a store sees it: its id and spec, its slice of the base version, its write buffer. */
final class OpenFamily(val id: Int, val spec: FamilySpec, val base: CommittedVersion, val buffer: WriteBuffer) {
  val codec: FamilyKeys = spec.codec(id)
  def numValueFields: Int = spec.valueSchema.length
}

/**
 * The column families of one store (write or read), on the version it is based on. Families are
 * found by name in the version's registry; one declared in this store gets the next free id and a
 * registry entry. Each family has a write buffer of its own (write stores), so a commit sends
 * family after family in id order, which is the keys' order.
 */
final class StoreFamilies(provider: PythonStateStoreProviderCore, base: CommittedVersion, writable: Boolean) {
  private lazy val inBase: Map[String, Int] = FamilyRegistry.read(base)
  /** Families by id this store has touched (removed ones stay until commit: their deletes). */
  private val byId = mutable.TreeMap.empty[Int, OpenFamily]
  /** name -> id as of now (after this store's creations and removals). */
  private val current = mutable.Map.empty[String, Int]
  private var removedNames = Set.empty[String]
  private lazy val registry: WriteBuffer = new WriteBuffer(FamilyRegistry.codec, FamilyRegistry.numValueFields)
  private var registryWritten = false

  private def idOf(name: String): Option[Int] = synchronized {
    current.get(name).orElse(if (removedNames(name)) None else inBase.get(name))
  }

  private def open(id: Int, spec: FamilySpec): OpenFamily = synchronized {
    byId.getOrElseUpdate(id, {
      val codec = spec.codec(id)
      val buffer = if (writable) new WriteBuffer(codec, spec.valueSchema.length) else null
      new OpenFamily(id, spec, base.family(codec, spec.valueSchema.length), buffer)
    })
  }

  /** The family `name` for reading: None when this version has no such family (it reads empty). */
  def forRead(name: String, operation: String): Option[OpenFamily] = {
    val spec = provider.familySpec(name).getOrElse(throw missing(name, operation))
    idOf(name).map(open(_, spec))
  }

  /** The family `name` for writing, created (with a registry entry) if this version lacks it. */
  def forWrite(name: String, operation: String): OpenFamily = synchronized {
    val spec = provider.familySpec(name).getOrElse(throw missing(name, operation))
    idOf(name) match {
      case Some(id) => open(id, spec)
      case None =>
        val used = inBase.values ++ byId.keys ++ current.values
        val id = if (used.isEmpty) FamilyRegistry.FirstFamilyId else used.max + 1
        if (id > 0xffff) throw new IllegalStateException(s"${provider.describeStore} has no column family id left")
        current(name) = id
        registry.write(FamilyRegistry.keyRow(name), FamilyRegistry.valueRow(id, spec))
        registryWritten = true
        open(id, spec)
    }
  }

  /** Declares `name` in this store (Spark's createColFamilyIfAbsent): created on first write or now. */
  def create(name: String): Unit = if (writable) forWrite(name, "createColFamilyIfAbsent")

  /** Removes `name` and every key it holds; whether it existed. */
  def remove(name: String): Boolean = synchronized {
    idOf(name) match {
      case None => false
      case Some(id) =>
        val family = open(id, provider.familySpec(name).getOrElse(throw missing(name, "removeColFamilyIfExists")))
        val it = pairs(family, null)
        try it.foreach { case (k, _) => family.buffer.write(k, null) } finally it.close()
        current.remove(name)
        removedNames += name
        registry.write(FamilyRegistry.keyRow(name), null)
        registryWritten = true
        true
    }
  }

  /**
   * The family's pairs (with `scanPrefix`, those starting with it) as of now, in key order: the
   * buffer's entries merged with the base's pairs the buffer did not write or delete.
   */
  def pairs(family: OpenFamily, scanPrefix: UnsafeRow): PairIterator = {
    val fromBase = if (scanPrefix == null) family.base.pairs() else family.base.withPrefix(scanPrefix)
    if (family.buffer == null || family.buffer.numWrites == 0) return fromBase
    val prefixBytes = if (scanPrefix == null) family.codec.familyPrefix else family.codec.scanPrefix(scanPrefix)
    val pending = family.buffer.sortedEntriesAt(family.buffer.now, prefixBytes)
    new PairIterator {
      private var i = 0
      private var baseHead: (Array[Byte], UnsafeRow, UnsafeRow) = _
      private var nextPair: (UnsafeRow, UnsafeRow) = _
      private def pullBase(): Unit =
        if (baseHead == null && fromBase.hasNext) {
          val (k, v) = fromBase.next()
          baseHead = (family.codec.encode(k), k, v)
        }
      private def advance(): Unit = {
        while (nextPair == null && (i < pending.length || { pullBase(); baseHead != null })) {
          pullBase()
          val c = if (baseHead == null) -1
            else if (i >= pending.length) 1
            else WriteBuffer.compareBytes(pending(i)._1, baseHead._1)
          if (c <= 0) {
            val (_, k, v) = pending(i)
            i += 1
            if (c == 0) baseHead = null // the buffer's write or delete replaces the base's pair
            if (v != null) nextPair = (k, v)
          } else {
            nextPair = (baseHead._2, baseHead._3)
            baseHead = null
          }
        }
      }
      override def hasNext: Boolean = { advance(); nextPair != null }
      override def next(): (UnsafeRow, UnsafeRow) = {
        advance()
        if (nextPair == null) throw new NoSuchElementException("no more pairs in the column family")
        val p = nextPair
        nextPair = null
        p
      }
      override def close(): Unit = fromBase.close()
    }
  }

  /** What the commit sends: the registry's changes, then each touched family's, in id order. */
  def commitParts: Seq[(WriteBuffer, CommittedVersion)] = synchronized {
    val registryPart =
      if (registryWritten) Seq(registry -> base.family(FamilyRegistry.codec, FamilyRegistry.numValueFields))
      else Nil
    registryPart ++ byId.values.filter(_.buffer != null).map(f => f.buffer -> f.base)
  }

  def memoryBytes: Long = synchronized {
    byId.values.filter(_.buffer != null).map(_.buffer.memoryBytes).sum +
      (if (registryWritten) registry.memoryBytes else 0L)
  }

  def close(): Unit = synchronized {
    byId.values.foreach(f => if (f.buffer != null) f.buffer.close())
    if (registryWritten) registry.close()
  }

  private def missing(name: String, operation: String): Throwable =
    org.apache.spark.sql.execution.streaming.state.pystatestore.SparkInternals
      .missingColumnFamily(operation, s"$name (store ${provider.describeStore})")
}
