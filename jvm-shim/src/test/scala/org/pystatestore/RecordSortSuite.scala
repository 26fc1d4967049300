package org.pystatestore

import scala.collection.mutable

import org.apache.spark.unsafe.Platform
import org.scalatest.funsuite.AnyFunSuite

import org.pystatestore.TestRows._

/**
 * The commit's key order (RecordSort): the frame reaches RocksDB's sorted SST writer, so keys must
 * come in unsigned byte order. The referee is TestRows.unsignedLess, a byte loop of its own.
 */
class RecordSortSuite extends AnyFunSuite {
  // A record layout unlike the write buffer's: the sort must read keys where it is told they are.
  private val KeyLengthAt = 5
  private val Header = 13
  private val Unused = -7L

  /** Lays `keys` out as records in native memory, sorts their addresses, returns the keys in that order. */
  private def sortByRecordSort(keys: IndexedSeq[Array[Byte]]): IndexedSeq[Array[Byte]] = {
    val block = NativeMemory.allocate(math.max(1L, keys.map(Header + _.length.toLong).sum))
    try {
      val positions = Array.fill(keys.size + 3)(Unused) // the sort is given more slots than records
      val keyAt = mutable.Map.empty[Long, Array[Byte]]
      var at = block
      for ((k, i) <- keys.zipWithIndex) {
        Platform.setMemory(at, 0xa5.toByte, Header) // bytes the sort must not take for the key
        Platform.putInt(null, at + KeyLengthAt, k.length)
        Platform.copyMemory(k, Platform.BYTE_ARRAY_OFFSET, null, at + Header, k.length)
        positions(i) = at
        keyAt(at) = k
        at += Header + k.length
      }
      new RecordSort(KeyLengthAt, Header).sortByKey(positions, keys.size)
      assert(positions.drop(keys.size).forall(_ == Unused), "the sort wrote past the records it was given")
      assert(positions.take(keys.size).toSet == keyAt.keySet, "the sort lost or invented records")
      positions.take(keys.size).map(keyAt).toIndexedSeq
    } finally NativeMemory.free(block)
  }

  private def assertSorted(keys: IndexedSeq[Array[Byte]], what: String): Unit = {
    val distinct = keys.map(_.toSeq).distinct.map(_.toArray)
    val sorted = sortByRecordSort(distinct)
    val expected = distinct.sortWith(unsignedLess)
    assertSameOrder(sorted, expected, s"$what, sorted by RecordSort")
  }

  private val rnd = new scala.util.Random(17)
  private def bytes(n: Int, alphabet: IndexedSeq[Int] = 0 until 256): Array[Byte] =
    Array.fill(n)(alphabet(rnd.nextInt(alphabet.size)).toByte)
  /** Bytes either side of the sign bit, and the extremes: where a signed comparison goes wrong. */
  private val edges = IndexedSeq(0x00, 0x01, 0x7f, 0x80, 0x81, 0xfe, 0xff)

  test("random keys of 0 to 40 bytes, every byte value, at sizes either side of the small-range sort") {
    val keys = (0 until 20000).map(_ => bytes(rnd.nextInt(41)))
    for (n <- Seq(0, 1, 2, 63, 64, 65, 1000, 20000)) assertSorted(keys.take(n), s"$n random keys")
  }

  test("keys that tie past 7, 8, 9, 16, 17 and 40 bytes, end in zero bytes, or are prefixes of each other") {
    val stems = Seq(0, 1, 7, 8, 9, 15, 16, 17, 40, 41).flatMap(n => Seq.fill(3)(bytes(n, edges)))
    val keys = (0 until 6000).map { _ =>
      val key = stems(rnd.nextInt(stems.size)) ++ bytes(rnd.nextInt(11), edges)
      // A key and the same with trailing zeros read alike through 8 zero-padded bytes: the length decides.
      if (rnd.nextInt(8) == 0) key ++ Array.fill(1 + rnd.nextInt(9))(0.toByte) else key
    }
    assertSorted(keys, "keys with shared stems")
    for (n <- Seq(3, 64, 65, 200)) assertSorted(keys.take(n), s"$n keys with shared stems")
  }

  test("runs of more than 64 keys equal in 8 bytes are sorted on the bytes after them") {
    // Groups differ in their first 8 bytes, so no byte is shared by all; within a group the radix pass
    // ties, and the run is sorted again from byte 8 (past where the group's keys share more).
    val keys = (0 until 8).flatMap { g =>
      val head = bytes(8, edges)
      val shared = bytes(g * 3, edges)
      (0 until 150).map(_ => head ++ shared ++ bytes(rnd.nextInt(20), edges))
    }
    assertSorted(keys, "grouped keys")
    val behindOneStem = Array.fill(300)(0.toByte) +: keys.map(k => Array.fill(30)(0xff.toByte) ++ k)
    assertSorted(behindOneStem, "grouped keys behind one stem")
  }

  test("a write buffer's commit pass visits Spark's key rows in RocksDB's bytewise order") {
    // Keys of every shape the sort treats apart, as UnsafeRows: strings sharing stems of many
    // lengths, trailing zero bytes, negative ints (high bytes 0xff), the empty string.
    val rnd = new scala.util.Random(11)
    val shared = Seq("", "a", "abcdefg", "abcdefgh", "abcdefghijklmnop", "x" * 40, "\u0000", "\u00ff\u00fe")
    val keys = (for (_ <- 0 until 6000) yield {
      val stem = shared(rnd.nextInt(shared.size))
      val tail = if (rnd.nextInt(4) == 0) "" else rnd.alphanumeric.take(rnd.nextInt(12)).mkString
      val padded = if (rnd.nextInt(10) == 0) tail + "\u0000" * rnd.nextInt(3) else tail
      (stem + padded, if (rnd.nextBoolean()) rnd.nextInt() else rnd.nextInt(3) - 1)
    }).distinct
    for (n <- Seq(keys.size, 65, 3)) {
      val buffer = new WriteBuffer(rawKeys, valueSchema.length)
      try {
        keys.take(n).foreach { case (k, i) => buffer.write(key(k, i), value(i)) }
        val seen = mutable.ArrayBuffer.empty[Array[Byte]]
        buffer.foreachWrite(sorted = true) { (_, bytes, keyAt, keyLength, _, _) =>
          seen += java.util.Arrays.copyOfRange(bytes, keyAt, keyAt + keyLength)
        }
        val expected = keys.take(n).map { case (k, i) => key(k, i).getBytes }.sortWith(unsignedLess)
        assertSameOrder(seen.toSeq, expected, s"$n keys through the commit's pass")
      } finally buffer.close()
    }
  }
}
