package org.pystatestore

import java.nio.ByteBuffer

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/** What a commit sends of one store or column family: its writes, its base, and whether its keys are internal. */
final case class CommitPart(buffer: WriteBuffer, base: CommittedVersion, internal: Boolean)

object FamilySpec {
  /** Spark's internal families (timers, TTL indexes) are named with '$' first; users' may not be. */
  def isInternalName(name: String): Boolean = name.startsWith("$")
}

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

  /** The encoder's arguments as the registry keeps them: prefix columns, or ordering ordinals. */
  def encoderArgs: String = encoder match {
    case PrefixKeyScanStateEncoderSpec(_, n) => n.toString
    case RangeKeyScanStateEncoderSpec(_, ordinals) => ordinals.mkString(",")
    case _ => ""
  }
}

/**
 * The registry of a store's column families, kept in the store itself as family 0: name -> (id,
 * key encoding and its arguments, multiple values, key and value schema as JSON). It is committed,
 * restored, copied and collected with the state, so a family keeps its id for the life of the
 * checkpoint whatever order Spark declares families in, a family can be removed in a run that never
 * declared it (transformWithState's deleteIfExists), and the offline tools can name each family's
 * rows. The entry named "" holds the highest id ever given: a removed family's id is never given
 * again, since a change feed over older versions still finds that family's rows under it.
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
    StructField("valueSchema", StringType, nullable = false),
    StructField("encoderArgs", StringType, nullable = false)))
  private val HighWater = ""
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
      UTF8String.fromString(spec.valueSchema.json),
      UTF8String.fromString(spec.encoderArgs))).copy()

  /** What `version` records: name -> (id, spec), and the highest id ever given (0: none). */
  def read(version: CommittedVersion): (Map[String, (Int, FamilySpec)], Int) = {
    val it = version.family(codec, numValueFields).pairs()
    try {
      val entries = it.map { case (k, v) => k.getUTF8String(0).toString -> v.copy() }.toList
      val highWater = entries.collectFirst { case (HighWater, v) => v.getInt(0) }.getOrElse(0)
      val families = entries.collect { case (name, v) if name != HighWater => name -> (v.getInt(0) -> specOf(name, v)) }
      (families.toMap, math.max(highWater, (families.map(_._2._1) :+ 0).max))
    } finally it.close()
  }

  /** The registry entry recording `id` as the highest id given. */
  def highWaterKey: UnsafeRow = keyRow(HighWater)
  def highWaterValue(id: Int): UnsafeRow =
    UnsafeProjection.create(valueSchema).apply(InternalRow(id, UTF8String.fromString(""), false,
      UTF8String.fromString(""), UTF8String.fromString(""), UTF8String.fromString(""))).copy()

  private def specOf(name: String, v: UnsafeRow): FamilySpec = {
    val keySchema = DataType.fromJson(v.getUTF8String(3).toString).asInstanceOf[StructType]
    val valueSchema = DataType.fromJson(v.getUTF8String(4).toString).asInstanceOf[StructType]
    val args = v.getUTF8String(5).toString
    val encoder = v.getUTF8String(1).toString match {
      case KeyCodec.Raw => NoPrefixKeyStateEncoderSpec(keySchema)
      case KeyCodec.Prefix => PrefixKeyScanStateEncoderSpec(keySchema, args.toInt)
      case KeyCodec.Range => RangeKeyScanStateEncoderSpec(keySchema, args.split(",").toSeq.map(_.toInt))
      case other => throw new IllegalStateException(s"column family $name is stored with unknown key encoding $other")
    }
    FamilySpec(name, keySchema, valueSchema, encoder, v.getBoolean(2))
  }
}

/**
 * Several values per key (`merge`, `putList`, `valuesIterator`): stored as one value, each row
 * as a 4-byte big-endian length and its bytes. The write buffer and RocksDB carry it as an opaque
 * row; only these functions look inside.
 */
object ValueLists {
  def encode(values: Iterable[UnsafeRow]): UnsafeRow = carrier(values.iterator.map(bytesOf).toSeq)

  def append(existing: UnsafeRow, values: Iterable[UnsafeRow]): UnsafeRow =
    if (existing == null) encode(values) else carrier(listed(existing) ++ values.iterator.map(bytesOf))

  private def bytesOf(v: UnsafeRow): Array[Byte] = v.getBytes

  /** Each value's bytes in a stored list. */
  private def listed(list: UnsafeRow): Seq[Array[Byte]] = decode(list, 1).map(_.getBytes).toSeq

  def decode(list: UnsafeRow, numValueFields: Int): Iterator[UnsafeRow] =
    if (list == null) Iterator.empty else {
      val bytes = list.getBytes
      val buf = ByteBuffer.wrap(bytes)
      new Iterator[UnsafeRow] {
        // The list is padded with zeros to a multiple of 8 bytes (UnsafeRow sizes are): a length
        // of 0 ends it, as no row has 0 bytes.
        override def hasNext: Boolean = buf.remaining() >= 4 && buf.getInt(buf.position()) != 0
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

  /**
   * An UnsafeRow object over the list of `values` (4-byte length, bytes; zeros up to a multiple of 8,
   * as UnsafeRow requires of its size), only to carry it through the buffer and views.
   */
  private def carrier(values: Seq[Array[Byte]]): UnsafeRow = {
    val size = values.map(4 + _.length).sum
    val out = ByteBuffer.allocate((size + 7) / 8 * 8)
    values.foreach { v => out.putInt(v.length); out.put(v) }
    KeyCodec.row(out.array(), 0, out.capacity(), 1)
  }
}

/** One family as a store sees it: its id and spec, its slice of the base version, its write buffer. */
final class OpenFamily(val id: Int, val spec: FamilySpec, val base: CommittedVersion, val buffer: WriteBuffer) {
  val codec: FamilyKeys = spec.codec(id)
  def numValueFields: Int = spec.valueSchema.length

  /** The value stored for `key` as the store sees it now (a write store: its buffer over the base). */
  def stored(key: UnsafeRow): UnsafeRow = if (buffer == null) base.get(key) else buffer.read(key, base.get)
}

/**
 * The column families of one store (write or read), on the version it is based on. Families are
 * found by name in the version's registry; one declared in this store gets the next free id and a
 * registry entry. Each family has a write buffer of its own (write stores), so a commit sends
 * family after family in id order, which is the keys' order.
 */
final class StoreFamilies(provider: PythonStateStoreProviderCore, base: CommittedVersion, writable: Boolean) {
  private lazy val recorded = FamilyRegistry.read(base)
  private lazy val inBase: Map[String, Int] = recorded._1.map { case (name, (id, _)) => name -> id }
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

  /** What Spark declared of `name`, else what the registry recorded of it when it was created. */
  private def specOf(name: String, operation: String): FamilySpec =
    provider.familySpec(name).orElse(recorded._1.get(name).map(_._2)).getOrElse(throw missing(name, operation))

  /** The family `name` for reading: None when this version has no such family (it reads empty). */
  def forRead(name: String, operation: String): Option[OpenFamily] = {
    val spec = specOf(name, operation)
    idOf(name).map(open(_, spec))
  }

  /** The family `name` for writing, created (with a registry entry) if this version lacks it. */
  def forWrite(name: String, operation: String): OpenFamily = synchronized {
    val spec = provider.familySpec(name).getOrElse(throw missing(name, operation))
    idOf(name) match {
      case Some(id) => open(id, spec)
      case None =>
        val used = Seq(recorded._2, FamilyRegistry.FirstFamilyId - 1) ++ byId.keys ++ current.values
        val id = used.max + 1
        if (id >= 0xffff) throw new IllegalStateException(s"${provider.describeStore} has no column family id left")
        current(name) = id
        registry.write(FamilyRegistry.keyRow(name), FamilyRegistry.valueRow(id, spec))
        registry.write(FamilyRegistry.highWaterKey, FamilyRegistry.highWaterValue(id))
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
        val family = open(id, specOf(name, "removeColFamilyIfExists"))
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

  /** Spark's `get`: a family with several values per key gives the first. */
  def get(name: String, key: UnsafeRow): UnsafeRow = forRead(name, "get").map { f =>
    val v = f.stored(key)
    if (f.spec.multipleValues) ValueLists.decode(v, f.numValueFields).nextOption().orNull else v
  }.orNull

  /** Spark's `valuesIterator` over `f`, a family declared with several values per key. */
  def values(f: OpenFamily, key: UnsafeRow): Iterator[UnsafeRow] = {
    StoreChecks.multipleValuesDeclared(f, "valuesIterator", provider)
    ValueLists.decode(f.stored(key), f.numValueFields)
  }

  /**
   * Spark's iterator over family `name` (with `prefixKey`, its prefix scan), in key order; a family
   * with several values per key gives each key once, with its first value (as Spark's RocksDB
   * provider does): its values come from `valuesIterator`.
   */
  def iterator(name: String, prefixKey: UnsafeRow, operation: String): StateStoreIterator[UnsafeRowPair] =
    forRead(name, operation) match {
      case None => StoreChecks.pairs(Iterator.empty)
      case Some(f) =>
        val it = pairs(f, prefixKey)
        if (!f.spec.multipleValues) StoreChecks.pairs(it)
        else StoreChecks.pairs(it.map { case (k, v) => k -> ValueLists.decode(v, f.numValueFields).next() }, it)
    }

  /** What the commit sends: the registry's changes, then each touched family's, in id order. */
  def commitParts: Seq[CommitPart] = synchronized {
    val registryPart =
      if (registryWritten) {
        Seq(CommitPart(registry, base.family(FamilyRegistry.codec, FamilyRegistry.numValueFields), internal = true))
      } else Nil
    registryPart ++ byId.values.filter(_.buffer != null).map { f =>
      CommitPart(f.buffer, f.base, internal = FamilySpec.isInternalName(f.spec.name))
    }
  }

  /** Whether this store created or removed a family (its commit is then a snapshot, as on Spark's RocksDB). */
  def familiesChanged: Boolean = synchronized(registryWritten)

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
