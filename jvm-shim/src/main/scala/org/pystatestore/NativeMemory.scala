package org.pystatestore

import org.apache.spark.unsafe.Platform

/**
 * The shim's native allocations. glibc serves a request of 32 MiB or more (its highest dynamic mmap
 * threshold on 64-bit) with a mapping of its own, unmapped when freed, of which only the pages
 * written become resident. A smaller request of 128 KiB or more is mapped too until the first such
 * mapping is freed; then glibc raises its threshold past it and serves it from its arenas, which
 * keep freed memory resident, split among whatever else they hold. On the scale bench (32M keys,
 * 1M new keys per partition per batch) the driver JVM's arenas held ~1,090 MiB at its peak while
 * the JVM had ~225 MiB allocated. So a request of 1 MiB or more asks for at least 32 MiB: the rest
 * of the mapping is address space, never touched.
 */
private[pystatestore] object NativeMemory {
  val OwnMappingBytes: Int = 32 << 20
  private val OwnMappingFrom = 1L << 20

  def allocate(bytes: Long): Long =
    Platform.allocateMemory(if (bytes >= OwnMappingFrom) math.max(bytes, OwnMappingBytes.toLong) else bytes)

  def free(address: Long): Unit = Platform.freeMemory(address)
}

/**
 * A write buffer's native pages: addresses, sizes and bytes used (of every page but the newest,
 * whose use the buffer tracks). Freed once, by the buffer's close or, for a buffer nobody closed,
 * by the Cleaner; so it must not refer to the buffer.
 */
private final class NativePages extends Runnable {
  var addresses = new Array[Long](4)
  var sizes = new Array[Int](4)
  var used = new Array[Int](4)
  var count = 0
  /** What the records use of every page but the newest. */
  var usedBeforeNewest = 0L

  /** Adds a page of `size` bytes; `usedInNewest` is what the previous newest page ended with. */
  def add(size: Int, usedInNewest: Int): Unit = synchronized {
    if (count == addresses.length) {
      addresses = java.util.Arrays.copyOf(addresses, count * 2)
      sizes = java.util.Arrays.copyOf(sizes, count * 2)
      used = java.util.Arrays.copyOf(used, count * 2)
    }
    if (count > 0) {
      used(count - 1) = usedInNewest
      usedBeforeNewest += usedInNewest
    }
    addresses(count) = NativeMemory.allocate(size)
    sizes(count) = size
    count += 1
  }

  override def run(): Unit = synchronized {
    var i = 0
    while (i < count) {
      NativeMemory.free(addresses(i))
      i += 1
    }
    count = 0
    usedBeforeNewest = 0
  }
}

/**
 * An open-addressing hash table (linear probing) of record positions in native memory, keyed by a
 * hash the caller computes. The caller probes it slot by slot (`firstSlot`, `nextSlot`) and decides
 * equality itself by reading the record, so no closure is allocated per lookup. A slot is empty
 * when its position is -1. Freed once, by the buffer's close or by the Cleaner, so it must not
 * refer to the buffer.
 */
private[pystatestore] final class PositionIndex extends Runnable {
  // `capacity` slots: their positions (8 bytes each), then their hashes (4 bytes each).
  private var capacity = 64
  private var address = allocate(capacity)
  private var entries = 0

  private def allocate(slots: Int): Long = {
    val at = NativeMemory.allocate(slots * 12L)
    Platform.setMemory(at, 0xff.toByte, slots * 8L) // every position -1: empty
    at
  }

  def size: Int = entries
  def firstSlot(hash: Int): Int = hash & (capacity - 1)
  def nextSlot(slot: Int): Int = (slot + 1) & (capacity - 1)
  def positionAt(slot: Int): Long = Platform.getLong(null, address + slot * 8L)
  def hashAt(slot: Int): Int = Platform.getInt(null, address + capacity * 8L + slot * 4L)

  /** Points the occupied `slot` at the newer record `pos`. */
  def replace(slot: Int, pos: Long): Unit = Platform.putLong(null, address + slot * 8L, pos)

  /** Fills the empty `slot` (found by probing for `hash`) with `pos`; earlier slots become stale. */
  def insert(slot: Int, hash: Int, pos: Long): Unit = {
    Platform.putLong(null, address + slot * 8L, pos)
    Platform.putInt(null, address + capacity * 8L + slot * 4L, hash)
    entries += 1
    if (entries * 2 > capacity) grow()
  }

  private def grow(): Unit = synchronized { // with run(): the Cleaner's thread sees the newest block
    val (oldAddress, oldCapacity) = (address, capacity)
    capacity = oldCapacity * 2
    address = allocate(capacity)
    var j = 0
    while (j < oldCapacity) {
      val pos = Platform.getLong(null, oldAddress + j * 8L)
      if (pos != -1L) {
        val hash = Platform.getInt(null, oldAddress + oldCapacity * 8L + j * 4L)
        var slot = firstSlot(hash)
        while (positionAt(slot) != -1L) slot = nextSlot(slot)
        Platform.putLong(null, address + slot * 8L, pos)
        Platform.putInt(null, address + capacity * 8L + slot * 4L, hash)
      }
      j += 1
    }
    NativeMemory.free(oldAddress)
  }

  def memoryBytes: Long = synchronized(if (address == 0L) 0L else capacity * 12L)

  override def run(): Unit = synchronized {
    if (address != 0L) NativeMemory.free(address)
    address = 0L
    entries = 0
  }
}
