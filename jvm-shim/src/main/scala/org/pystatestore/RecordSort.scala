package org.pystatestore

import org.apache.spark.unsafe.Platform

/**
 * Orders a write buffer's newest records by their key bytes for the commit: the views' backend
 * (rocksdb) writes the commit frame straight into a sorted SST file. It reads the records in place
 * in the buffer's pages, while the buffer holds its lock; in the buffer's record layout a record's
 * key length is an Int at `keyLengthAt` and its key bytes start at `header`.
 */
private[pystatestore] final class RecordSort(keyLengthAt: Int, header: Int) {
  import RecordSort.SmallSort

  /**
   * Sorts the record addresses `positions[0, count)` by their records' key bytes (keys are
   * distinct, RocksDB's bytewise order). A radix sort on 8 key bytes at a time, taken where the
   * keys start to differ (an aggregation's keys share their null bits: the sort reads the bytes
   * after them), with the address carried along: it reads each key once per pass, where a
   * comparison sort chased two record pointers per comparison (~20 per key at 250k keys: 200 ms of
   * a 250k-key commit, more in a fresh JVM). Keys that tie on those bytes are sorted on the next 8;
   * small ranges by comparison. Its arrays are native and freed at once: the heap never holds them.
   */
  def sortByKey(positions: Array[Long], count: Int): Unit = {
    if (count <= SmallSort) { comparisonSort(positions, 0, count); return }
    val bytes = count.toLong * 8
    val block = NativeMemory.allocate(bytes * 4)
    try {
      val sorting = new RadixSort(block, block + bytes, block + 2 * bytes, block + 3 * bytes)
      Platform.copyMemory(positions, Platform.LONG_ARRAY_OFFSET, null, block, bytes)
      sorting.sort(0, count, 0)
      Platform.copyMemory(null, block, positions, Platform.LONG_ARRAY_OFFSET, bytes)
    } finally NativeMemory.free(block)
  }

  /** Native arrays of record addresses and their keys' 8-byte prefixes, and scratch of each. */
  private final class RadixSort(addresses: Long, prefixes: Long, addressesTmp: Long, prefixesTmp: Long) {
    private def at(array: Long, i: Int): Long = Platform.getLong(null, array + 8L * i)
    private def set(array: Long, i: Int, v: Long): Unit = Platform.putLong(null, array + 8L * i, v)
    private val counts = new Array[Int](8 * 256)

    /** Sorts `[lo, hi)`, whose keys all have the same bytes before `from`. */
    def sort(lo: Int, hi: Int, from: Int): Unit = {
      val offset = from + sharedPrefix(lo, hi, from)
      var i = lo
      while (i < hi) { set(prefixes, i, prefixAt(at(addresses, i), offset)); i += 1 }
      radix(lo, hi)
      i = lo
      while (i < hi) { // runs of keys equal in these 8 bytes: ordered by what follows them
        val p = at(prefixes, i)
        var j = i + 1
        while (j < hi && at(prefixes, j) == p) j += 1
        if (j - i > 1) {
          if (j - i <= SmallSort || longestKey(i, j) <= offset + 8) {
            val run = new Array[Long](j - i)
            Platform.copyMemory(null, addresses + 8L * i, run, Platform.LONG_ARRAY_OFFSET, 8L * run.length)
            comparisonSort(run, 0, run.length)
            Platform.copyMemory(run, Platform.LONG_ARRAY_OFFSET, null, addresses + 8L * i, 8L * run.length)
          } else sort(i, j, offset + 8)
        }
        i = j
      }
    }

    /** LSD radix sort of `[lo, hi)` by prefix (unsigned), a byte per pass; bytes all keys share are skipped. */
    private def radix(lo: Int, hi: Int): Unit = {
      java.util.Arrays.fill(counts, 0)
      var i = lo
      while (i < hi) {
        val p = at(prefixes, i)
        var d = 0
        while (d < 8) { counts(d * 256 + ((p >>> (8 * d)) & 0xff).toInt) += 1; d += 1 }
        i += 1
      }
      var (srcA, srcP, dstA, dstP) = (addresses, prefixes, addressesTmp, prefixesTmp)
      var d = 0
      while (d < 8) {
        val base = d * 256
        if (!(0 until 256).exists(b => counts(base + b) == hi - lo)) {
          var next = lo
          var b = 0
          while (b < 256) { val c = counts(base + b); counts(base + b) = next; next += c; b += 1 }
          i = lo
          while (i < hi) {
            val p = at(srcP, i)
            val slot = base + ((p >>> (8 * d)) & 0xff).toInt
            val to = counts(slot)
            counts(slot) = to + 1
            set(dstP, to, p)
            set(dstA, to, at(srcA, i))
            i += 1
          }
          val (a, p) = (srcA, srcP)
          srcA = dstA; srcP = dstP; dstA = a; dstP = p
        }
        d += 1
      }
      if (srcA != addresses) {
        Platform.copyMemory(null, srcA + 8L * lo, null, addresses + 8L * lo, 8L * (hi - lo))
        Platform.copyMemory(null, srcP + 8L * lo, null, prefixes + 8L * lo, 8L * (hi - lo))
      }
    }

    /** How many bytes from `from` on every key of `[lo, hi)` shares (at most the shortest key's rest). */
    private def sharedPrefix(lo: Int, hi: Int, from: Int): Int = {
      val first = at(addresses, lo)
      val a = first + header + from
      var shared = Platform.getInt(null, first + keyLengthAt) - from
      var i = lo + 1
      while (i < hi && shared > 0) {
        val r = at(addresses, i)
        val b = r + header + from
        val limit = math.min(shared, Platform.getInt(null, r + keyLengthAt) - from)
        var n = 0
        while (n + 8 <= limit && Platform.getLong(null, a + n) == Platform.getLong(null, b + n)) n += 8
        while (n < limit && Platform.getByte(null, a + n) == Platform.getByte(null, b + n)) n += 1
        shared = n
        i += 1
      }
      math.max(0, shared)
    }

    private def longestKey(lo: Int, hi: Int): Int = {
      var longest = 0
      var i = lo
      while (i < hi) { longest = math.max(longest, Platform.getInt(null, at(addresses, i) + keyLengthAt)); i += 1 }
      longest
    }
  }

  /** The 8 key bytes of the record at `record` from `offset`, big-endian, zeros past the key's end. */
  private def prefixAt(record: Long, offset: Int): Long = {
    val length = Platform.getInt(null, record + keyLengthAt)
    val keyAt = record + header + offset
    if (length - offset >= 8) java.lang.Long.reverseBytes(Platform.getLong(null, keyAt))
    else {
      var p = 0L
      var i = 0
      while (i < 8) {
        p = (p << 8) | (if (offset + i < length) Platform.getByte(null, keyAt + i) & 0xffL else 0L)
        i += 1
      }
      p
    }
  }

  /**
   * Sorts `positions[from, until)` by key comparison: quicksort on the primitive array (median of
   * three, insertion sort for short ranges), no boxing.
   */
  private def comparisonSort(positions: Array[Long], from: Int, until: Int): Unit = {
    def swap(i: Int, j: Int): Unit = { val t = positions(i); positions(i) = positions(j); positions(j) = t }
    def sort(from: Int, until: Int): Unit = {
      var lo = from
      var hi = until
      while (hi - lo > 16) {
        val mid = (lo + hi) >>> 1
        if (compareKeys(positions(mid), positions(lo)) < 0) swap(mid, lo)
        if (compareKeys(positions(hi - 1), positions(lo)) < 0) swap(hi - 1, lo)
        if (compareKeys(positions(hi - 1), positions(mid)) < 0) swap(hi - 1, mid)
        val pivot = positions(mid)
        var i = lo
        var j = hi - 1
        while (i <= j) {
          while (compareKeys(positions(i), pivot) < 0) i += 1
          while (compareKeys(positions(j), pivot) > 0) j -= 1
          if (i <= j) { swap(i, j); i += 1; j -= 1 }
        }
        // Recurse into the smaller side, loop on the larger: the stack stays O(log n).
        if (j - lo < hi - i) { sort(lo, j + 1); lo = i } else { sort(i, hi); hi = j + 1 }
      }
      var k = lo + 1
      while (k < hi) {
        val x = positions(k)
        var m = k - 1
        while (m >= lo && compareKeys(positions(m), x) > 0) { positions(m + 1) = positions(m); m -= 1 }
        positions(m + 1) = x
        k += 1
      }
    }
    sort(from, until)
  }

  /** Unsigned lexicographic order of the keys of the records at addresses `a` and `b`. */
  private def compareKeys(a: Long, b: Long): Int = {
    val aAt = a + header
    val bAt = b + header
    val aLength = Platform.getInt(null, a + keyLengthAt)
    val bLength = Platform.getInt(null, b + keyLengthAt)
    val common = math.min(aLength, bLength)
    var i = 0
    while (i + 8 <= common) {
      val x = java.lang.Long.reverseBytes(Platform.getLong(null, aAt + i))
      val y = java.lang.Long.reverseBytes(Platform.getLong(null, bAt + i))
      if (x != y) return java.lang.Long.compareUnsigned(x, y)
      i += 8
    }
    while (i < common) {
      val x = Platform.getByte(null, aAt + i) & 0xff
      val y = Platform.getByte(null, bAt + i) & 0xff
      if (x != y) return x - y
      i += 1
    }
    aLength - bLength
  }
}

private object RecordSort {
  /** Ranges up to this many keys are sorted by comparison, not by radix. */
  val SmallSort = 64
}
