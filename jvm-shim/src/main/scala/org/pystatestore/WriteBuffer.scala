package org.pystatestore

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.unsafe.Platform
import org.apache.spark.unsafe.array.ByteArrayMethods
import org.apache.spark.unsafe.hash.Murmur3_x86_32

/**
 * The uncommitted writes of one version (DESIGN §2 write buffer): an append-only log of records in
 * pages of native memory, with an open-addressing hash index (also native) from key to the key's
 * newest record. A micro-batch of a million writes is a few dozen native pages, not millions of
 * Java objects, and no call crosses JNI (RocksDB's WriteBatchWithIndex cost ~4 µs per write and
 * ~1.5 µs per entry read back; this costs a hash probe and a copy). Off the heap because pages
 * that live for a whole task made G1 grow the heap by more than twice their size; rows handed to
 * Spark are copies, so nothing outside points into memory the buffer frees. The index is native for
 * the same reason: at a million keys its arrays are humongous G1 objects, reallocated each version.
 *
 * Records are never moved or changed once written, except the pointer to the record that
 * supersedes them, so a point-in-time view is just a position in the log: `iterator()` and
 * `prefixScan()` see the buffer as it was when they started while Spark keeps writing.
 *
 * Besides writes the log holds *read marks*: whether the base version had a key Spark read
 * (Spark reads most keys before writing them, often through a read store that is then upgraded).
 * A write inherits its key's mark, so the commit knows which written keys are new without asking
 * the base. Marks are never visible as entries.
 *
 * Keys are in `codec`'s encoding. For prefix-scan stores that encoding starts with the prefix
 * (`prefix-v1`), and every write is also linked into a chain per prefix, so a prefix scan walks
 * only its prefix's records. Every call holds the buffer's lock: Spark may use a store from more
 * than one thread.
 *
 * Its native blocks (pages, hash indexes, and how they are allocated) are in NativeMemory.scala;
 * the commit's key order is RecordSort's. Here: the records, the views and the commit's pass.
 */
final class WriteBuffer(codec: KeyCodec, numValueFields: Int) extends AutoCloseable {
  import WriteBuffer._

  private val prefixed = codec.prefixScans
  private val header = if (prefixed) HeaderWithPrefixLink else Header

  private val native = new NativePages()
  private val cleanable = WriteBuffer.cleaner.register(this, native) // frees pages a leak would keep
  private var used = 0 // bytes used in the newest page

  private val keyIndex = new PositionIndex()
  private val keyIndexCleanable = WriteBuffer.cleaner.register(this, keyIndex)
  /** Prefix-scan stores: prefix -> the newest write with that prefix (the head of its chain). */
  private val prefixIndex = if (prefixed) new PositionIndex() else null
  private val prefixIndexCleanable = if (prefixed) WriteBuffer.cleaner.register(this, prefixIndex) else null

  private var open = true
  private var writes = 0L
  /** The newest position a point-in-time view was taken at: records before it are never rewritten. */
  private var viewFloor = 0L
  /** Reused to hand a record's bytes to the commit. */
  private var scratch = new Array[Byte](256)

  def isOpen: Boolean = synchronized(open)

  private def checkOpen(): Unit =
    if (!open) throw new IllegalStateException("the store's write buffer was released")

  // ---- records ----
  // A position is (page index << 32 | offset in page): positions grow with every append.

  private def addressOf(pos: Long): Long = native.addresses((pos >>> 32).toInt) + (pos & 0xffffffffL)

  private def prevOf(pos: Long): Long = Platform.getLong(null, addressOf(pos) + PrevAt)
  private def nextOf(pos: Long): Long = Platform.getLong(null, addressOf(pos) + NextAt)
  private def flagsOf(pos: Long): Int = Platform.getByte(null, addressOf(pos) + FlagsAt) & 0xff
  private def keyLengthOf(pos: Long): Int = Platform.getInt(null, addressOf(pos) + KeyLengthAt)
  private def valueLengthOf(pos: Long): Int = Platform.getInt(null, addressOf(pos) + ValueLengthAt)
  private def prefixPrevOf(pos: Long): Long = Platform.getLong(null, addressOf(pos) + PrefixLinkAt)
  private def keyAddress(pos: Long): Long = addressOf(pos) + header
  private def valueAddress(pos: Long): Long = keyAddress(pos) + keyLengthOf(pos)

  private def keyEquals(pos: Long, key: Array[Byte], length: Int): Boolean =
    keyLengthOf(pos) == length &&
      ByteArrayMethods.arrayEquals(null, keyAddress(pos), key, Platform.BYTE_ARRAY_OFFSET, length)

  private def prefixEquals(pos: Long, prefix: Array[Byte], length: Int): Boolean =
    keyLengthOf(pos) >= length &&
      ByteArrayMethods.arrayEquals(null, keyAddress(pos), prefix, Platform.BYTE_ARRAY_OFFSET, length)

  private def copyOut(address: Long, length: Int): Array[Byte] = {
    val out = new Array[Byte](length)
    Platform.copyMemory(null, address, out, Platform.BYTE_ARRAY_OFFSET, length)
    out
  }

  /** Appends a record; returns its position. */
  private def append(flags: Int, prev: Long, key: Array[Byte], value: UnsafeRow): Long = {
    val valueLength = if (value == null) 0 else value.getSizeInBytes
    val size = header + key.length + valueLength
    if (native.count == 0 || used + size > native.sizes(native.count - 1)) {
      // Small at first (most stores write little), doubling, then pages of a mapping of their own
      // (NativeMemory); a larger record gets its own page.
      val next =
        if (native.count == 0) FirstPageBytes
        else if (native.sizes(native.count - 1) >= LastSmallPageBytes) NativeMemory.OwnMappingBytes
        else native.sizes(native.count - 1) * 2
      native.add(math.max(next, size), used)
      used = 0
    }
    val pos = ((native.count - 1).toLong << 32) | used
    val address = addressOf(pos)
    Platform.putLong(null, address + PrevAt, prev)
    Platform.putLong(null, address + NextAt, NoRecord)
    Platform.putByte(null, address + FlagsAt, flags.toByte)
    Platform.putInt(null, address + KeyLengthAt, key.length)
    Platform.putInt(null, address + ValueLengthAt, valueLength)
    Platform.copyMemory(key, Platform.BYTE_ARRAY_OFFSET, null, address + header, key.length)
    if (value != null) value.writeToMemory(null, address + header + key.length)
    used += size
    pos
  }

  private def hashOf(bytes: Array[Byte], length: Int): Int =
    Murmur3_x86_32.hashUnsafeBytes(bytes, Platform.BYTE_ARRAY_OFFSET, length, 42)

  /**
   * The slot of `index` that holds the record for `bytes[0, length)` (`hash` is its hash), or the
   * empty slot where it would go: matched on the record's whole key, or with `prefix` on its
   * key's prefix. The slot stays valid until the index's next insert.
   */
  private def slotOf(index: PositionIndex, hash: Int, bytes: Array[Byte], length: Int, prefix: Boolean): Int = {
    var slot = index.firstSlot(hash)
    var pos = index.positionAt(slot)
    while (pos != NoRecord && !(index.hashAt(slot) == hash &&
        (if (prefix) prefixEquals(pos, bytes, length) else keyEquals(pos, bytes, length)))) {
      slot = index.nextSlot(slot)
      pos = index.positionAt(slot)
    }
    slot
  }

  /** The newest record of `key` (encoded), or NoRecord. */
  private def find(key: Array[Byte]): Long =
    keyIndex.positionAt(slotOf(keyIndex, hashOf(key, key.length), key, key.length, prefix = false))

  /** Length of the scan prefix a key starts with (e.g. `prefix-v1`: the 4-byte length, then the prefix row). */
  private def prefixLength(key: Array[Byte]): Int = codec.prefixLengthOf(key, 0)

  // ---- the store's calls ----

  /**
   * What a read of `key` sees: the buffered value, null for a buffered delete, or else what
   * `fromBase` gives, which is then remembered as a read mark.
   */
  def read(key: UnsafeRow, fromBase: UnsafeRow => UnsafeRow): UnsafeRow = synchronized {
    checkOpen()
    val encoded = codec.encode(key)
    val pos = find(encoded)
    if (pos != NoRecord && (flagsOf(pos) & MarkFlag) == 0) {
      if ((flagsOf(pos) & DeleteFlag) != 0) null else valueRow(pos)
    } else {
      val v = fromBase(key)
      if (pos == NoRecord) addMark(encoded, v != null)
      v
    }
  }

  /** Leaves a read mark: `key` was read from the base, which has it iff `present`. */
  def mark(key: UnsafeRow, present: Boolean): Unit = synchronized {
    checkOpen()
    val encoded = codec.encode(key)
    if (find(encoded) == NoRecord) addMark(encoded, present)
  }

  /** Adds a read mark for a key the buffer does not hold. */
  private def addMark(encoded: Array[Byte], present: Boolean): Unit = {
    val hash = hashOf(encoded, encoded.length)
    val slot = slotOf(keyIndex, hash, encoded, encoded.length, prefix = false)
    keyIndex.insert(slot, hash, append(MarkFlag | (if (present) Present else Absent), NoRecord, encoded, null))
  }

  /**
   * Can the write of `value` take the place of the read mark at `pos`? Spark reads most keys just
   * before writing them (an aggregation's get, then put), so the mark is usually the newest record:
   * the write then overwrites it where it lies and the key costs one record, not two (a million new
   * keys per store and batch at the 32M-key scale: 41 MB less per store). Only when no point-in-time
   * view was taken since the mark was written (a view would see the write appear before its
   * position) and the write fits in what is left of the newest page.
   */
  private def foldable(pos: Long, keyLength: Int, value: UnsafeRow): Boolean = {
    val offset = pos & 0xffffffffL
    (flagsOf(pos) & MarkFlag) != 0 && pos >= viewFloor && (pos >>> 32) == native.count - 1 &&
      offset + header + keyLengthOf(pos) == used &&
      offset + header + keyLength + (if (value == null) 0 else value.getSizeInBytes) <= native.sizes(native.count - 1)
  }

  /** Turns the read mark at `pos` (the newest record, see `foldable`) into a write of `value`. */
  private def overwriteMark(pos: Long, flags: Int, value: UnsafeRow): Long = {
    val address = addressOf(pos)
    val keyLength = keyLengthOf(pos)
    val valueLength = if (value == null) 0 else value.getSizeInBytes
    // A mark has no previous record and nothing supersedes it; the key's bytes stay where they are.
    Platform.putByte(null, address + FlagsAt, flags.toByte)
    Platform.putInt(null, address + ValueLengthAt, valueLength)
    if (value != null) value.writeToMemory(null, address + header + keyLength)
    used = ((pos & 0xffffffffL) + header + keyLength + valueLength).toInt
    pos
  }

  /** Buffers `value` for `key`; null buffers a delete. */
  def write(key: UnsafeRow, value: UnsafeRow): Unit = synchronized {
    checkOpen()
    val encoded = codec.encode(key)
    val hash = hashOf(encoded, encoded.length)
    val slot = slotOf(keyIndex, hash, encoded, encoded.length, prefix = false)
    val old = keyIndex.positionAt(slot)
    val inBase = if (old == NoRecord) Unknown else flagsOf(old) & BaseMask
    val flags = inBase | (if (value == null) DeleteFlag else 0)
    val pos =
      if (old != NoRecord && foldable(old, encoded.length, value)) overwriteMark(old, flags, value)
      else {
        val appended = append(flags, old, encoded, value)
        if (old == NoRecord) keyIndex.insert(slot, hash, appended)
        else {
          Platform.putLong(null, addressOf(old) + NextAt, appended)
          keyIndex.replace(slot, appended)
        }
        appended
      }
    if (prefixed) {
      val length = prefixLength(encoded)
      val prefixHash = hashOf(encoded, length)
      val headSlot = slotOf(prefixIndex, prefixHash, encoded, length, prefix = true)
      val head = prefixIndex.positionAt(headSlot)
      Platform.putLong(null, addressOf(pos) + PrefixLinkAt, head)
      if (head == NoRecord) prefixIndex.insert(headSlot, prefixHash, pos) else prefixIndex.replace(headSlot, pos)
    }
    writes += 1
  }

  private def valueRow(pos: Long): UnsafeRow = {
    val bytes = copyOut(valueAddress(pos), valueLengthOf(pos))
    KeyCodec.row(bytes, 0, bytes.length, numValueFields)
  }

  private def keyRow(pos: Long): UnsafeRow = codec.decode(copyOut(keyAddress(pos), keyLengthOf(pos)))

  // ---- point-in-time views ----

  /** A position in the log: every record written from now on is at or after it. */
  def now: Long = synchronized {
    checkOpen()
    val at = if (native.count == 0) 0L else ((native.count - 1).toLong << 32) | used
    viewFloor = math.max(viewFloor, at)
    at
  }

  /** Is `pos` the key's newest write as of `at` (written before it and not superseded before it)? */
  private def visibleAt(pos: Long, at: Long): Boolean =
    pos < at && (flagsOf(pos) & MarkFlag) == 0 && { val n = nextOf(pos); n == NoRecord || n >= at }

  /**
   * The buffer's entries as of `at` (from `now`): (key, value), value null for a delete; only
   * those whose key starts with `scanPrefix` if given (prefix-scan stores). Rows are read lazily,
   * each step under the lock, so Spark may write while it iterates.
   */
  def entriesAt(at: Long, scanPrefix: Array[Byte] = null): Iterator[(UnsafeRow, UnsafeRow)] = {
    val positions: Iterator[Long] = if (scanPrefix == null) recordsUpTo(at) else synchronized {
      checkOpen()
      val head = prefixIndex.positionAt(
        slotOf(prefixIndex, hashOf(scanPrefix, scanPrefix.length), scanPrefix, scanPrefix.length, prefix = true))
      Iterator.iterate(head)(p => synchronized { checkOpen(); prefixPrevOf(p) }).takeWhile(_ != NoRecord)
    }
    positions.flatMap { pos =>
      synchronized {
        checkOpen()
        if (!visibleAt(pos, at)) None
        else Some(keyRow(pos) -> (if ((flagsOf(pos) & DeleteFlag) != 0) null else valueRow(pos)))
      }
    }
  }

  /**
   * The buffer's entries as of `at`, in ascending order of their encoded keys (RocksDB's bytewise
   * order): (encoded key, key, value or null for a delete). Column families iterate in key order
   * (range-scan families must), so their buffer entries are merged with the base in that order.
   */
  def sortedEntriesAt(at: Long, scanPrefix: Array[Byte] = null): IndexedSeq[(Array[Byte], UnsafeRow, UnsafeRow)] = {
    val entries = synchronized {
      checkOpen()
      val out = scala.collection.mutable.ArrayBuffer.empty[(Array[Byte], UnsafeRow, UnsafeRow)]
      val it = recordsUpTo(at)
      while (it.hasNext) {
        val pos = it.next()
        if (visibleAt(pos, at)) {
          val encoded = copyOut(keyAddress(pos), keyLengthOf(pos))
          if (scanPrefix == null || WriteBuffer.startsWith(encoded, scanPrefix)) {
            val value = if ((flagsOf(pos) & DeleteFlag) != 0) null else valueRow(pos)
            out += ((encoded, codec.decode(encoded), value))
          }
        }
      }
      out
    }
    entries.sortWith((a, b) => WriteBuffer.compareBytes(a._1, b._1) < 0).toIndexedSeq
  }

  /** Every record position before `at`, in log order. */
  private def recordsUpTo(at: Long): Iterator[Long] = new Iterator[Long] {
    private var pos = if (at == 0L) NoRecord else 0L
    override def hasNext: Boolean = pos != NoRecord
    override def next(): Long = {
      val current = pos
      pos = WriteBuffer.this.synchronized {
        checkOpen()
        val end = (current & 0xffffffffL) + header + keyLengthOf(current) + valueLengthOf(current)
        val pageIndex = current >>> 32
        val following = if (end < usedIn(pageIndex.toInt)) (pageIndex << 32) | end else (pageIndex + 1) << 32
        if (following < at) following else NoRecord
      }
      current
    }
  }

  /** Bytes used in a page: a page may end with a gap (the next record did not fit). */
  private def usedIn(pageIndex: Int): Int = if (pageIndex == native.count - 1) used else native.used(pageIndex)

  /** Does the buffer, as of `at`, hold a write (or delete) of `key`? */
  def writtenAt(key: UnsafeRow, at: Long): Boolean = synchronized {
    checkOpen()
    var pos = find(codec.encode(key))
    while (pos != NoRecord && pos >= at) pos = prevOf(pos)
    pos != NoRecord && (flagsOf(pos) & MarkFlag) == 0
  }

  // ---- the commit ----

  /**
   * Calls `visit` for every key's newest write under the lock: (flags, bytes, key offset, key
   * length, value offset, value length), offsets into `bytes`, which hold the record only until
   * `visit` returns. In log order, or with `sorted` in ascending order of the key bytes (unsigned,
   * RocksDB's bytewise order). `isDelete` and `presentInBase` read the flags.
   */
  def foreachWrite(sorted: Boolean = false)(visit: (Int, Array[Byte], Int, Int, Int, Int) => Unit): Unit =
    synchronized {
      checkOpen()
      // Sized once: every key with a write has an index entry (a humongous array regrown per
      // commit was much of the shim's garbage).
      val newest = new Array[Long](math.max(1, keyIndex.size))
      var count = 0
      val it = recordsUpTo(now)
      while (it.hasNext) {
        val pos = it.next()
        if ((flagsOf(pos) & MarkFlag) == 0 && nextOf(pos) == NoRecord) {
          newest(count) = addressOf(pos) // pages never move while the lock is held
          count += 1
        }
      }
      if (sorted) new RecordSort(KeyLengthAt, header).sortByKey(newest, count)
      var i = 0
      while (i < count) {
        val record = newest(i)
        val keyLength = Platform.getInt(null, record + KeyLengthAt)
        val valueLength = Platform.getInt(null, record + ValueLengthAt)
        if (scratch.length < keyLength + valueLength) scratch = new Array[Byte](keyLength + valueLength)
        Platform.copyMemory(null, record + header, scratch, Platform.BYTE_ARRAY_OFFSET, keyLength + valueLength)
        visit(Platform.getByte(null, record + FlagsAt) & 0xff, scratch, 0, keyLength, keyLength, valueLength)
        i += 1
      }
    }

  /** The key in `bytes[offset, offset + length)`, pointing into `bytes`. */
  def decodeKey(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow = codec.decode(bytes, offset, length)

  /** The value in `bytes[offset, offset + length)`, pointing into `bytes`. */
  def decodeValue(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow =
    KeyCodec.row(bytes, offset, length, numValueFields)

  /** Writes and deletes buffered (overwrites included; marks not). */
  def numWrites: Long = synchronized(writes)

  /** Bytes the buffer holds: what its records use of its pages (the rest is never touched), and its indexes. */
  def memoryBytes: Long = synchronized {
    if (!open) 0L
    else native.usedBeforeNewest + used + keyIndex.memoryBytes + (if (prefixIndex == null) 0L else prefixIndex.memoryBytes)
  }

  /** Frees the pages. Every later call fails; rows handed out are copies and stay valid. */
  override def close(): Unit = synchronized {
    if (open) {
      open = false
      cleanable.clean()
      keyIndexCleanable.clean()
      if (prefixIndexCleanable != null) prefixIndexCleanable.clean()
      scratch = null
    }
  }
}

object WriteBuffer {
  private val cleaner = java.lang.ref.Cleaner.create()

  /** Unsigned lexicographic order of byte strings: RocksDB's bytewise comparator. */
  def compareBytes(a: Array[Byte], b: Array[Byte]): Int = java.util.Arrays.compareUnsigned(a, b)

  def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && java.util.Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)

  /** A position that is no record. */
  private val NoRecord = -1L

  // What a write knows of its key in the base version (from a read mark).
  val Unknown = 0
  val Present = 1
  val Absent = 2
  val BaseMask = 3
  val DeleteFlag = 4
  val MarkFlag = 8

  def isDelete(flags: Int): Boolean = (flags & DeleteFlag) != 0

  /** Does the base version have a written key? Known from its read mark, else `lookUp`. */
  def presentInBase(flags: Int)(lookUp: => Boolean): Boolean = flags & BaseMask match {
    case Present => true
    case Absent => false
    case _ => lookUp
  }

  // Record layout: prev (the key's previous record), next (the record superseding this one),
  // flags, key length, value length, [prefix link: the previous write with the same prefix],
  // key bytes, value bytes.
  private val PrevAt = 0
  private val NextAt = 8
  private val FlagsAt = 16
  private val KeyLengthAt = 17
  private val ValueLengthAt = 21
  private val Header = 25
  private val PrefixLinkAt = 25
  private val HeaderWithPrefixLink = 33

  private val FirstPageBytes = 4096
  private val LastSmallPageBytes = 512 << 10
}
