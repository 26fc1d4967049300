package org.pystatestore

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/** The rows the unit tests write: keys (k: string, i: int) as Spark's aggregations have, values (v: int). */
object TestRows {
  val keySchema: StructType = StructType(Seq(StructField("k", StringType), StructField("i", IntegerType)))
  val valueSchema: StructType = StructType(Seq(StructField("v", IntegerType)))
  private val keyProjection = UnsafeProjection.create(keySchema)
  private val valueProjection = UnsafeProjection.create(valueSchema)
  private val prefixProjection = UnsafeProjection.create(StructType(Seq(StructField("k", StringType))))

  // A projection reuses one output row: each row handed out is a copy.
  def key(k: String, i: Int = 0): UnsafeRow =
    keyProjection.synchronized { keyProjection(InternalRow(UTF8String.fromString(k), i)).copy() }
  def value(v: Int): UnsafeRow = valueProjection.synchronized { valueProjection(InternalRow(v)).copy() }
  def prefix(k: String): UnsafeRow =
    prefixProjection.synchronized { prefixProjection(InternalRow(UTF8String.fromString(k))).copy() }

  def rawKeys: KeyCodec = new RawKeys(keySchema.length)
  /** prefix-v1 over the key's first column (k), as a session window's store has. */
  def prefixKeys: KeyCodec = new PrefixKeys(new PrefixKeySpec(keySchema, 1), keySchema.length)

  def keyOf(row: UnsafeRow): (String, Int) = (row.getUTF8String(0).toString, row.getInt(1))
  def valueOf(row: UnsafeRow): Option[Int] = Option(row).map(_.getInt(0))

  /** Unsigned lexicographic order of byte strings, written out here: the referee of every key order. */
  def unsignedLess(a: Array[Byte], b: Array[Byte]): Boolean = {
    var i = 0
    while (i < a.length && i < b.length) {
      val (x, y) = (a(i) & 0xff, b(i) & 0xff)
      if (x != y) return x < y
      i += 1
    }
    a.length < b.length
  }

  /**
   * Fails unless `seen` holds exactly `expected`, no key twice; the message names the sizes and a few
   * keys that differ (a whole map in a message is unreadable).
   */
  def assertSameEntries[K, V](seen: Seq[(K, V)], expected: Map[K, V], what: => String): Unit = {
    val asMap = seen.toMap
    val differ = (asMap.keySet ++ expected.keySet).filter(k => asMap.get(k) != expected.get(k)).take(3)
    if (differ.nonEmpty || asMap.size != seen.size) {
      org.scalatest.Assertions.fail(s"$what: ${seen.size} entries (${asMap.size} keys), expected ${expected.size}; " +
        differ.map(k => s"$k: ${asMap.get(k)} where ${expected.get(k)} belongs").mkString(", "))
    }
  }

  /** Fails unless `seen` and `expected` hold the same byte strings in the same order, naming the first that differs. */
  def assertSameOrder(seen: Seq[Array[Byte]], expected: Seq[Array[Byte]], what: => String): Unit = {
    def show(b: Array[Byte]) = b.map(_ & 0xff).mkString("[", ",", "]")
    if (seen.size != expected.size) org.scalatest.Assertions.fail(s"$what: ${seen.size} keys, expected ${expected.size}")
    seen.indices.find(i => !java.util.Arrays.equals(seen(i), expected(i))).foreach { i =>
      org.scalatest.Assertions.fail(s"$what: position $i of ${seen.size} holds ${show(seen(i))} where " +
        s"${show(expected(i))} belongs")
    }
  }

  /** Are `keys` strictly ascending in unsigned byte order? */
  def ascending(keys: Seq[Array[Byte]]): Boolean = keys.zip(keys.drop(1)).forall { case (a, b) => unsignedLess(a, b) }
}
