package org.pystatestore

import java.io.File
import java.nio.ByteBuffer
import java.util.concurrent.atomic.AtomicLong
import java.util.concurrent.locks.ReentrantReadWriteLock

import scala.jdk.CollectionConverters._
import scala.util.control.NonFatal

import org.rocksdb.{BlockBasedTableConfig, BloomFilter, LRUCache, Options, ReadOptions, RocksDB, RocksDBException, RocksIterator}

import org.apache.spark.TaskContext
import org.apache.spark.internal.Logging
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.Platform

/** An iterator over state pairs that holds resources until it is exhausted or closed. */
trait PairIterator extends Iterator[(UnsafeRow, UnsafeRow)] with AutoCloseable

object PairIterator {
  def of(it: Iterator[(UnsafeRow, UnsafeRow)]): PairIterator = new PairIterator {
    override def hasNext: Boolean = it.hasNext
    override def next(): (UnsafeRow, UnsafeRow) = it.next()
    override def close(): Unit = ()
  }
}

/**
 * A committed version as a store reads it: on the heap (`VersionState`, the memory backend) or a
 * read-only RocksDB view the worker left on local disk (`RocksView`, the rocksdb backend). Views
 * are reference counted: whoever holds one calls `release()` exactly once.
 */
trait CommittedVersion {
  def version: Long
  def manifestId: String
  def numKeys: Long
  /** Of numKeys, those in internal column families (Spark's numKeys leaves them out). */
  def numInternalKeys: Long = 0L
  def get(key: UnsafeRow): UnsafeRow
  def contains(key: UnsafeRow): Boolean = get(key) != null
  def pairs(): PairIterator
  /** Pairs whose key starts with `prefix` (prefix-scan stores only). */
  def withPrefix(prefix: UnsafeRow): PairIterator
  /** JVM memory this version holds (an estimate; a view reports its share of shared caches). */
  def memoryBytes: Long
  def retain(): Unit = ()
  def release(): Unit = ()
  /**
   * One column family of this version (a store with column families): its keys are those starting
   * with `codec`'s family id, read with `codec` and values of `numValueFields` fields. It holds no
   * reference of its own: the store that asks holds this version.
   */
  def family(codec: FamilyKeys, numValueFields: Int): CommittedVersion =
    if (numKeys == 0) new EmptyVersion(version, manifestId)
    else throw new IllegalStateException(s"column families are read through RocksDB views, not from $this")
}

/** A version without keys (version 0 of a family, or of a store). */
final class EmptyVersion(val version: Long, val manifestId: String) extends CommittedVersion {
  override def numKeys: Long = 0L
  override def get(key: UnsafeRow): UnsafeRow = null
  override def pairs(): PairIterator = PairIterator.of(Iterator.empty)
  override def withPrefix(prefix: UnsafeRow): PairIterator = PairIterator.of(Iterator.empty)
  override def memoryBytes: Long = 0L
}

/**
 * How a store's keys are laid out in RocksDB. `raw` is Spark's key row as it is. `prefix-v1`
 * (prefix-scan stores, e.g. session windows) puts the prefix first: a 4-byte big-endian length of
 * the prefix row, the prefix row, then the whole key row, so a prefix scan is a seek over a byte
 * prefix and decoding a key is a slice. Must match KEY_ENCODING_* in python/pystatestore/manifest.py.
 */
sealed trait KeyCodec extends Serializable {
  def name: String
  def encode(key: UnsafeRow): Array[Byte]
  def decode(bytes: Array[Byte]): UnsafeRow = decode(bytes, 0, bytes.length)
  /** The key row in `bytes[offset, offset + length)`, pointing into `bytes` (no copy). */
  def decode(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow
  def scanPrefix(prefix: UnsafeRow): Array[Byte]
  /** Keys start with a scan prefix (prefix-scan encoders): the write buffer chains writes per prefix. */
  def prefixScans: Boolean = false
  /** The length of the scan prefix the encoded key at `bytes[offset..]` starts with (prefixScans only). */
  def prefixLengthOf(bytes: Array[Byte], offset: Int): Int =
    throw new IllegalStateException(s"key encoding $name has no scan prefix")
}

object KeyCodec {
  val Raw = "raw"
  val Prefix = "prefix-v1"
  val Range = "range-v1"
  /** A store with column families (FamilyKeys); must match KEY_ENCODING_FAMILIES in manifest.py. */
  val Families = "families-v1"

  private[pystatestore] def row(bytes: Array[Byte], offset: Int, length: Int, numFields: Int): UnsafeRow = {
    val r = new UnsafeRow(numFields)
    r.pointTo(bytes, Platform.BYTE_ARRAY_OFFSET + offset, length)
    r
  }
}

final class RawKeys(numKeyFields: Int) extends KeyCodec {
  override def name: String = KeyCodec.Raw
  override def encode(key: UnsafeRow): Array[Byte] = key.getBytes
  override def decode(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow =
    KeyCodec.row(bytes, offset, length, numKeyFields)
  override def scanPrefix(prefix: UnsafeRow): Array[Byte] =
    throw new IllegalStateException("prefix scan on a store without a prefix-scan key encoder")
}

final class PrefixKeys(spec: PrefixKeySpec, numKeyFields: Int) extends KeyCodec {
  // Projections are not thread-safe; Spark may call a store from more than one thread.
  @transient private lazy val projection = new ThreadLocal[UnsafeProjection] {
    override def initialValue(): UnsafeProjection = spec.newProjection()
  }

  override def name: String = KeyCodec.Prefix

  override def encode(key: UnsafeRow): Array[Byte] = {
    val prefix = projection.get().apply(key)
    val out = ByteBuffer.allocate(4 + prefix.getSizeInBytes + key.getSizeInBytes)
    out.putInt(prefix.getSizeInBytes)
    prefix.writeTo(out)
    key.writeTo(out)
    out.array()
  }

  override def decode(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow = {
    val start = 4 + ByteBuffer.wrap(bytes, offset, 4).getInt
    KeyCodec.row(bytes, offset + start, length - start, numKeyFields)
  }

  override def scanPrefix(prefix: UnsafeRow): Array[Byte] = {
    val out = ByteBuffer.allocate(4 + prefix.getSizeInBytes)
    out.putInt(prefix.getSizeInBytes)
    prefix.writeTo(out)
    out.array()
  }

  override def prefixScans: Boolean = true
  override def prefixLengthOf(bytes: Array[Byte], offset: Int): Int = 4 + ByteBuffer.wrap(bytes, offset, 4).getInt
}

/**
 * `range-v1` (range-scan families, e.g. timers): the ordering columns first, each as a marker byte
 * (0x00 negative, 0x01 zero or positive, 0x02 null, so nulls sort last) and its value big-endian,
 * fixed width; negative floating-point values with every bit flipped, so RocksDB's bytewise order
 * is the columns' numeric order, as Spark's range-scan encoder orders them. The whole key row
 * follows, so decoding a key is a slice.
 */
final class RangeKeys(keySchema: StructType, orderingOrdinals: Seq[Int]) extends KeyCodec {
  import RangeKeys._
  private val columns: Array[(Int, DataType)] = orderingOrdinals.map(i => i -> keySchema(i).dataType).toArray
  columns.foreach { case (i, t) =>
    if (widthOf(t) < 0) throw new IllegalArgumentException(
      s"range scan over column ${keySchema(i).name} of type ${t.simpleString}: only boolean, byte, short, int, " +
        "long, float, double, date and timestamp columns can order a range scan")
  }
  private val orderingBytes = columns.map { case (_, t) => 1 + widthOf(t) }.sum
  private val numKeyFields = keySchema.length

  override def name: String = KeyCodec.Range

  override def encode(key: UnsafeRow): Array[Byte] = {
    val out = ByteBuffer.allocate(orderingBytes + key.getSizeInBytes)
    columns.foreach { case (i, t) => putOrdered(out, key, i, t) }
    key.writeTo(out)
    out.array()
  }

  override def decode(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow =
    KeyCodec.row(bytes, offset + orderingBytes, length - orderingBytes, numKeyFields)

  override def scanPrefix(prefix: UnsafeRow): Array[Byte] =
    throw new IllegalStateException("prefix scan on a range-scan column family")
}

object RangeKeys {
  private val Negative: Byte = 0x00
  private val NonNegative: Byte = 0x01
  private val Null: Byte = 0x02

  /** Bytes of a column's value in the ordering part; -1 for a type that cannot order a range scan. */
  def widthOf(t: DataType): Int = t match {
    case BooleanType | ByteType => 1
    case ShortType => 2
    case IntegerType | DateType | FloatType => 4
    case LongType | TimestampType | TimestampNTZType | DoubleType => 8
    case _ => -1
  }

  private def putOrdered(out: ByteBuffer, row: UnsafeRow, i: Int, t: DataType): Unit = {
    if (row.isNullAt(i)) {
      out.put(Null)
      out.put(new Array[Byte](widthOf(t)))
      return
    }
    t match {
      case BooleanType => out.put(NonNegative).put(if (row.getBoolean(i)) 1.toByte else 0.toByte)
      case ByteType => val v = row.getByte(i); out.put(sign(v < 0)).put(v)
      case ShortType => val v = row.getShort(i); out.put(sign(v < 0)).putShort(v)
      case IntegerType | DateType => val v = row.getInt(i); out.put(sign(v < 0)).putInt(v)
      case LongType | TimestampType | TimestampNTZType => val v = row.getLong(i); out.put(sign(v < 0)).putLong(v)
      case FloatType =>
        val bits = java.lang.Float.floatToRawIntBits(row.getFloat(i))
        if (bits < 0) out.put(Negative).putInt(~bits) else out.put(NonNegative).putInt(bits)
      case DoubleType =>
        val bits = java.lang.Double.doubleToRawLongBits(row.getDouble(i))
        if (bits < 0) out.put(Negative).putLong(~bits) else out.put(NonNegative).putLong(bits)
      case other => throw new IllegalArgumentException(s"range scan over a ${other.simpleString} column")
    }
  }

  private def sign(negative: Boolean): Byte = if (negative) Negative else NonNegative
}

/**
 * A column family's keys in a store with column families: a 2-byte big-endian family id, then the
 * key as the family's own encoding lays it out. Every family lives in one RocksDB keyspace, so a
 * family is a key prefix: committed, restored, copied and collected as any key, and iterated by
 * seeking to its id.
 */
final class FamilyKeys(val familyId: Int, val inner: KeyCodec) extends KeyCodec {
  require(familyId >= 0 && familyId <= 0xffff, s"column family id $familyId out of range")
  val familyPrefix: Array[Byte] = Array((familyId >>> 8).toByte, familyId.toByte)

  override def name: String = inner.name

  override def encode(key: UnsafeRow): Array[Byte] = withFamily(inner.encode(key))

  override def decode(bytes: Array[Byte], offset: Int, length: Int): UnsafeRow =
    inner.decode(bytes, offset + 2, length - 2)

  override def scanPrefix(prefix: UnsafeRow): Array[Byte] = withFamily(inner.scanPrefix(prefix))
  override def prefixScans: Boolean = inner.prefixScans
  override def prefixLengthOf(bytes: Array[Byte], offset: Int): Int = 2 + inner.prefixLengthOf(bytes, offset + 2)

  private def withFamily(encoded: Array[Byte]): Array[Byte] = {
    val out = new Array[Byte](2 + encoded.length)
    out(0) = familyPrefix(0)
    out(1) = familyPrefix(1)
    System.arraycopy(encoded, 0, out, 2, encoded.length)
    out
  }
}

/**
 * The JVM's RocksDB resources, shared by every view in this JVM: the native library, one LRU
 * block cache bounded by `jvmBlockCacheMB` (index and filter blocks are kept in it too, so the
 * bound covers them), and the options views are opened with.
 */
object RocksViews extends Logging {
  val DefaultBlockCacheMB = 32L
  /** Point reads a view weighs when it picks how to read a key (halved once reached). */
  val RecentReadsWindow = 1024
  private val IndexAndFilterShare = 0.5
  private var cache: LRUCache = _
  private var options: Options = _
  private var capacityBytes = 0L
  private val openViews = new AtomicLong()
  /** Providers open in this JVM: shared memory is reported per store as its share. */
  private val openProviders = new AtomicLong()
  /** Resident memory of each worker slot, as of its last reply. */
  private val workerRss = new java.util.concurrent.ConcurrentHashMap[Int, Long]()

  def configure(blockCacheMB: Long): Unit = synchronized {
    if (options == null) {
      RocksDB.loadLibrary()
      capacityBytes = blockCacheMB * 1024 * 1024
      // Half the cache is kept for index and filter blocks: every lookup needs its files' filters,
      // and without a reserved pool the data blocks that filter false positives read (most
      // lookups of a growing key space miss) evict them and the cache thrashes.
      cache = new LRUCache(capacityBytes, -1, false, IndexAndFilterShare)
      val table = new BlockBasedTableConfig()
        .setBlockCache(cache)
        .setCacheIndexAndFilterBlocks(true)
        .setCacheIndexAndFilterBlocksWithHighPriority(true)
        .setPinL0FilterAndIndexBlocksInCache(false)
        .setFilterPolicy(new BloomFilter(10))
      options = new Options()
        .setCreateIfMissing(false)
        .setMaxOpenFiles(-1)
        .setTableFormatConfig(table)
    } else if (blockCacheMB * 1024 * 1024 != capacityBytes) {
      logWarning(s"pystatestore: the JVM block cache was already sized at ${capacityBytes >> 20} MiB by the first " +
        s"store; ignoring jvmBlockCacheMB=$blockCacheMB")
    }
  }

  private[pystatestore] def open(dir: File): RocksDB = {
    val opts = synchronized {
      if (options == null) configure(DefaultBlockCacheMB)
      options
    }
    val db = RocksDB.openReadOnly(opts, dir.getPath)
    openViews.incrementAndGet()
    db
  }

  private[pystatestore] def closed(): Unit = openViews.decrementAndGet()

  def blockCacheUsage: Long = synchronized { if (cache == null) 0L else cache.getUsage }

  def noteWorkerRss(slot: Int, bytes: Long): Unit = if (bytes > 0) workerRss.put(slot, bytes)

  private lazy val releaser = java.util.concurrent.Executors.newSingleThreadExecutor(
    new java.util.concurrent.ThreadFactory {
      override def newThread(r: Runnable): Thread = {
        val t = new Thread(r, "pystatestore-view-releases")
        t.setDaemon(true)
        t
      }
    })

  /**
   * Releases `version` on a background thread: a provider's cache evicts its oldest version when
   * a commit adds one, and closing that view's RocksDB and deleting its directory cost the commit
   * milliseconds on the task's thread.
   */
  def releaseLater(version: CommittedVersion): Unit = releaser.execute(() => version.release())

  def providerOpened(): Unit = openProviders.incrementAndGet()
  def providerClosed(): Unit = openProviders.decrementAndGet()
  def viewsOpen: Long = openViews.get()

  private def share(total: Long): Long = total / math.max(1L, openProviders.get())

  /** One store's share of the JVM block cache in use. */
  def blockCacheShare: Long = share(blockCacheUsage)

  /** One store's share of the Python workers' resident memory (as of their last replies). */
  def workerRssShare: Long = share(workerRss.values().asScala.sum)

  def version: String = try RocksDB.rocksdbVersion().toString catch { case NonFatal(_) => "unknown" }
}

/**
 * A committed version read from the read-only RocksDB checkpoint the worker left at `dir`. Opened
 * on first use; closed and deleted once the last holder releases it (the provider's cache holds
 * the first reference, each store and each open iterator one more). Reads hold a read lock and the
 * final close the write lock, so no native call ever runs on a closed handle. A view a durable-first
 * commit left to the worker to make after it replied comes with `awaitReady`, called once, before
 * the first open, outside every monitor (it may call the worker); a failed one is tried again by
 * the next read.
 */
final class RocksView(
    val dir: File,
    val version: Long,
    val manifestId: String,
    val numKeys: Long,
    override val numInternalKeys: Long,
    codec: KeyCodec,
    numValueFields: Int,
    describe: String,
    awaitReady: () => Unit = null) extends CommittedVersion with Logging {

  private val lock = new ReentrantReadWriteLock()
  private var refs = 1
  private var db: RocksDB = _
  private var closed = false
  private var readOptionsValue: ReadOptions = _
  private val readyLock = new Object
  @volatile private var ready = awaitReady == null
  private var recentReads = 0
  private var recentMisses = 0

  private def readOptions: ReadOptions = synchronized {
    if (readOptionsValue == null) readOptionsValue = new ReadOptions().setVerifyChecksums(true)
    readOptionsValue
  }

  private def reading[T](f: RocksDB => T): T = {
    val rl = lock.readLock()
    rl.lock()
    try {
      if (closed) throw new IllegalStateException(s"the read view of $describe version $version is closed")
      f(handle())
    } finally rl.unlock()
  }

  private def handle(): RocksDB = {
    var h = db
    if (h == null && !ready) readyLock.synchronized {
      if (!ready) {
        awaitReady()
        ready = true
      }
    }
    if (h == null) synchronized {
      if (db == null) {
        db = try RocksViews.open(dir) catch {
          case e: RocksDBException => throw new IllegalStateException(
            s"pystatestore: the read view of $describe version $version at $dir does not open in Spark's " +
              s"rocksdbjni ${RocksViews.version} (${e.getMessage}). The worker's RocksDB wrote a format this JVM " +
              "cannot read: install the pystatestore release built for this Spark version.", e)
        }
      }
      h = db
    }
    h
  }

  override def get(key: UnsafeRow): UnsafeRow = getWith(codec, numValueFields, key)

  override def contains(key: UnsafeRow): Boolean = containsWith(codec, key)

  override def pairs(): PairIterator = iterate(codec, numValueFields, _.seekToFirst(), null)

  override def withPrefix(prefix: UnsafeRow): PairIterator = {
    val p = codec.scanPrefix(prefix)
    iterate(codec, numValueFields, _.seek(p), p)
  }

  override def family(familyCodec: FamilyKeys, familyValueFields: Int): CommittedVersion = {
    val view = this
    new CommittedVersion {
      override def version: Long = view.version
      override def manifestId: String = view.manifestId
      override def numKeys: Long = view.numKeys
      override def get(key: UnsafeRow): UnsafeRow = getWith(familyCodec, familyValueFields, key)
      override def contains(key: UnsafeRow): Boolean = containsWith(familyCodec, key)
      override def pairs(): PairIterator = {
        val p = familyCodec.familyPrefix
        iterate(familyCodec, familyValueFields, _.seek(p), p)
      }
      override def withPrefix(prefix: UnsafeRow): PairIterator = {
        val p = familyCodec.scanPrefix(prefix)
        iterate(familyCodec, familyValueFields, _.seek(p), p)
      }
      override def memoryBytes: Long = 0L // the view's own reports it
      override def toString: String = s"$view, column family ${familyCodec.familyId}"
    }
  }

  private def getWith(keys: KeyCodec, valueFields: Int, key: UnsafeRow): UnsafeRow = {
    val v = reading(d => lookup(d, keys.encode(key)))
    if (v == null) null else KeyCodec.row(v, 0, v.length, valueFields)
  }

  /**
   * The value of `k`, or null. rocksdbjni's `get` reports a missing key by throwing and catching a
   * C++ exception inside the native call: a miss costs more than a hit (decision 0035), and every
   * new key of a growing state is a miss. `keyMayExist` rules a missing key out from the filters and
   * cached blocks without that, but a present key then costs a second lookup. So the view asks it
   * first only while most of its recent reads missed. (Its cached value is not used: it came back
   * empty for some present keys in rocksdbjni 9.8.4.)
   */
  private def lookup(d: RocksDB, k: Array[Byte]): Array[Byte] = {
    val v =
      if (recentMisses * 2 <= recentReads) d.get(readOptions, k)
      else if (d.keyMayExist(readOptions, k, null)) d.get(readOptions, k)
      else null
    // Unsynchronized: tasks sharing a view may lose a count, which only delays the choice.
    recentReads += 1
    if (v == null) recentMisses += 1
    if (recentReads >= RocksViews.RecentReadsWindow) { // halve both: follow the recent mix
      recentReads >>= 1
      recentMisses >>= 1
    }
    v
  }

  private def containsWith(keys: KeyCodec, key: UnsafeRow): Boolean =
    reading(_.keyExists(readOptions, keys.encode(key)))

  /** A native iterator positioned by `position`, kept while keys start with `prefix` (if given). */
  private def iterate(
      codec: KeyCodec, numValueFields: Int, position: RocksIterator => Unit, prefix: Array[Byte]): PairIterator = {
    retain() // the iterator holds the view open until it is exhausted or closed
    val it = try reading { d => val i = d.newIterator(readOptions); position(i); i } catch {
      case NonFatal(e) => release(); throw e
    }
    val iter = new PairIterator {
      private var done = false
      override def hasNext: Boolean = !done && {
        val more = reading(_ => it.isValid && (prefix == null || startsWith(it.key(), prefix)))
        if (!more) close()
        more
      }
      override def next(): (UnsafeRow, UnsafeRow) = {
        if (!hasNext) throw new NoSuchElementException("no more pairs in the read view")
        val (k, v) = reading { _ => val kv = (it.key(), it.value()); it.next(); kv }
        (codec.decode(k), KeyCodec.row(v, 0, v.length, numValueFields))
      }
      override def close(): Unit = if (!done) {
        done = true
        try reading(_ => it.close()) finally release()
      }
    }
    // An iterator Spark leaves unfinished is closed with its task, like Spark's own RocksDB does.
    Option(TaskContext.get()).foreach(_.addTaskCompletionListener[Unit](_ => iter.close()))
    iter
  }

  private def startsWith(key: Array[Byte], prefix: Array[Byte]): Boolean =
    key.length >= prefix.length && java.util.Arrays.equals(key, 0, prefix.length, prefix, 0, prefix.length)

  override def memoryBytes: Long = RocksViews.blockCacheShare

  override def retain(): Unit = synchronized {
    if (refs <= 0) throw new IllegalStateException(s"the read view of $describe version $version is closed")
    refs += 1
  }

  override def release(): Unit = {
    val last = synchronized {
      refs -= 1
      refs == 0
    }
    if (last) closeAndDelete()
  }

  private def closeAndDelete(): Unit = {
    val wl = lock.writeLock()
    wl.lock()
    try {
      closed = true
      if (db != null) {
        db.close()
        db = null
        RocksViews.closed()
      }
      synchronized { if (readOptionsValue != null) readOptionsValue.close() }
    } finally wl.unlock()
    StateWorker.deleteRecursively(dir)
  }

  override def toString: String = s"RocksView($describe, version $version, $dir)"
}
