package org.pystatestore

import java.io.File
import java.nio.file.Files

import scala.collection.mutable

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.UnsafeProjection
import org.apache.spark.sql.types._
import org.rocksdb.{FlushOptions, Options, RocksDB}
import org.scalatest.funsuite.AnyFunSuite

import org.pystatestore.TestRows._

/**
 * Read views (RocksView) and key encodings (KeyCodec) over RocksDB directories the tests write
 * themselves with the rocksdbjni of Spark's jars, as the worker's rocksdict writes a view: what a
 * view reads is what was put, in RocksDB's order, and its life ends with its last holder.
 */
class ReadViewsSuite extends AnyFunSuite {
  type Key = (String, Int)

  private def newDir(): File = Files.createTempDirectory("pystatestore-views-test").toFile

  /** Writes `puts` (encoded key -> value bytes, null: a delete) into a new RocksDB at `dir`, in several files. */
  private def writeDb(dir: File, batches: Seq[Seq[(Array[Byte], Array[Byte])]]): Unit = {
    RocksDB.loadLibrary()
    val options = new Options().setCreateIfMissing(true)
    val db = RocksDB.open(options, dir.getPath)
    val flush = new FlushOptions().setWaitForFlush(true)
    try batches.foreach { batch =>
      batch.foreach { case (k, v) => if (v == null) db.delete(k) else db.put(k, v) }
      db.flush(flush) // each batch an SST file of its own: a later file's delete or put must win
    } finally { db.close(); flush.close(); options.close() }
  }

  private def view(dir: File, codec: KeyCodec, numKeys: Long): RocksView =
    new RocksView(dir, 7L, "manifest-7", numKeys, 0L, codec, valueSchema.length, "store test/0/0")

  /** Random puts and deletes over keys of 12 prefixes, in three files; returns what the keys end as. */
  private def randomHistory(
      codec: KeyCodec, rnd: scala.util.Random): (Seq[Seq[(Array[Byte], Array[Byte])]], Map[Key, Int]) = {
    val model = mutable.Map.empty[Key, Int]
    val batches = (0 until 3).map { _ =>
      (0 until 1500).map { _ =>
        val k = (s"g${rnd.nextInt(12)}", rnd.nextInt(300) - 150)
        if (rnd.nextInt(4) == 0) { model -= k; codec.encode(key(k._1, k._2)) -> null }
        else { val v = rnd.nextInt(); model(k) = v; codec.encode(key(k._1, k._2)) -> value(v).getBytes }
      }
    }
    (batches, model.toMap)
  }

  test("a view reads every key, every pair in RocksDB's order and every prefix as they were written") {
    val codec = prefixKeys
    val dir = newDir()
    val (batches, model) = randomHistory(codec, new scala.util.Random(23))
    writeDb(dir, batches)
    val v = view(dir, codec, model.size)
    try {
      for (p <- 0 until 12; i <- -150 until 150) {
        val k = (s"g$p", i)
        assert(valueOf(v.get(key(k._1, k._2))) == model.get(k), s"get $k")
        assert(v.contains(key(k._1, k._2)) == model.contains(k), s"contains $k")
      }
      val pairs = v.pairs().map { case (k, x) => (codec.encode(k), keyOf(k), x.getInt(0)) }.toVector
      assertSameEntries(pairs.map(p => p._2 -> p._3), model, "the view's pairs")
      assert(ascending(pairs.map(_._1)), "pairs out of RocksDB's order")
      for (p <- 0 until 12) {
        val scanned = v.withPrefix(prefix(s"g$p")).map { case (k, x) => keyOf(k) -> x.getInt(0) }.toVector
        assertSameEntries(scanned, model.filter(_._1._1 == s"g$p"), s"prefix scan of g$p")
      }
      assert(v.withPrefix(prefix("g")).isEmpty, "a prefix row is matched whole, not as a string prefix")
    } finally v.release()
  }

  test("after a run of misses a view rules keys out first, and still finds every key that is there") {
    // Most reads of a growing state miss: the view then asks keyMayExist before get (decision 0035);
    // a present key must still be found on that path, and once hits are the rule again on the other.
    val codec = rawKeys
    val dir = newDir()
    val present = (0 until 2000).map(i => ("k", i) -> i * 3).toMap
    writeDb(dir, Seq(present.toSeq.map { case ((k, i), x) => codec.encode(key(k, i)) -> value(x).getBytes }))
    val v = view(dir, codec, present.size)
    try {
      for (round <- 0 until 3) {
        (0 until 5000).foreach(i => assert(v.get(key("absent", i)) == null, s"absent key $i"))
        present.foreach { case ((k, i), x) => assert(valueOf(v.get(key(k, i))) == Some(x), s"round $round: ($k, $i)") }
      }
    } finally v.release()
  }

  test("column families: each reads its own keys only, by its own encoding, in one keyspace") {
    val dir = newDir()
    val plain = new FamilyKeys(1, rawKeys)
    val scanned = new FamilyKeys(257, prefixKeys) // 0x0101: its low byte is family 1's id, so both bytes must count
    val rnd = new scala.util.Random(29)
    val (plainPuts, plainModel) = randomHistory(plain, rnd)
    val (scannedPuts, scannedModel) = randomHistory(scanned, rnd)
    writeDb(dir, plainPuts.zip(scannedPuts).map { case (a, b) => a ++ b })
    val v = view(dir, rawKeys, plainModel.size + scannedModel.size)
    try {
      for ((codec, model) <- Seq(plain -> plainModel, scanned -> scannedModel)) {
        val family = v.family(codec, valueSchema.length)
        val all = family.pairs().map { case (k, x) => keyOf(k) -> x.getInt(0) }.toVector
        assertSameEntries(all, model, s"family ${codec.familyId}'s pairs")
        model.keys.take(200).foreach(k => assert(valueOf(family.get(key(k._1, k._2))) == model.get(k)))
      }
      val family = v.family(scanned, valueSchema.length)
      for (p <- 0 until 12) {
        val rows = family.withPrefix(prefix(s"g$p")).map { case (k, x) => keyOf(k) -> x.getInt(0) }.toVector
        assertSameEntries(rows, scannedModel.filter(_._1._1 == s"g$p"), s"family 257, prefix g$p")
      }
      val onlyInPlain = plainModel.keySet -- scannedModel.keySet
      assert(onlyInPlain.nonEmpty)
      onlyInPlain.take(50).foreach(k => assert(family.get(key(k._1, k._2)) == null, s"$k read through another family"))
    } finally v.release()
    assert(intercept[IllegalArgumentException](new FamilyKeys(0x10000, rawKeys)).getMessage.contains("out of range"))
  }

  test("range-v1: RocksDB's byte order of the encoded keys is the ordering columns' numeric order, nulls last") {
    val schema = StructType(Seq(StructField("d", DoubleType), StructField("n", LongType), StructField("f", FloatType),
      StructField("s", IntegerType)))
    val codec = new RangeKeys(schema, Seq(0, 1, 2))
    val projection = UnsafeProjection.create(schema)
    val doubles = Seq(Double.NegativeInfinity, Double.MinValue, -1.5, -Double.MinPositiveValue, -0.0, 0.0,
      Double.MinPositiveValue, 2.25, Double.MaxValue, Double.PositiveInfinity, Double.NaN)
    val longs = Seq(Long.MinValue, -257L, -1L, 0L, 1L, 256L, Long.MaxValue)
    val floats = Seq(Float.NegativeInfinity, -3.5f, -0.0f, 0.0f, 1e-40f, 7.0f)
    val rnd = new scala.util.Random(31)
    type Cols = (Option[Double], Option[Long], Option[Float])
    val rows: Seq[Cols] = (0 until 3000).map { _ =>
      def pick[T](xs: Seq[T]): Option[T] = if (rnd.nextInt(8) == 0) None else Some(xs(rnd.nextInt(xs.size)))
      (pick(doubles), pick(longs), pick(floats)) // repeats are fine: only the ordering columns are judged
    }
    def encode(c: Cols, s: Int): Array[Byte] = codec.encode(projection(InternalRow(
      c._1.getOrElse(null), c._2.getOrElse(null), c._3.getOrElse(null), s)).copy())
    // The referee: Java's total orders of each type (-0.0 before 0.0, NaN last), then nulls last.
    def compareColumn[T](a: Option[T], b: Option[T])(cmp: (T, T) => Int): Int = (a, b) match {
      case (None, None) => 0
      case (None, _) => 1
      case (_, None) => -1
      case (Some(x), Some(y)) => cmp(x, y)
    }
    def compare(a: Cols, b: Cols): Int = Seq(
      compareColumn(a._1, b._1)(java.lang.Double.compare),
      compareColumn(a._2, b._2)(java.lang.Long.compare),
      compareColumn(a._3, b._3)(java.lang.Float.compare)).find(_ != 0).getOrElse(0)
    val byBytes = rows.zipWithIndex
      .sortWith { case ((a, i), (b, j)) => unsignedLess(encode(a, i), encode(b, j)) }.map(_._1)
    val byValue = rows.sortWith((a, b) => compare(a, b) < 0)
    byBytes.indices.find(i => compare(byBytes(i), byValue(i)) != 0).foreach { i =>
      fail(s"position $i of ${rows.size} in byte order: ${byBytes(i)} where ${byValue(i)} belongs")
    }
    val row = projection(InternalRow(-0.0, 5L, null, 9)).copy()
    assert(codec.decode(codec.encode(row)) == row, "a key decodes back to its row")
    val refused = intercept[IllegalArgumentException](new RangeKeys(schema.add("t", StringType), Seq(4)))
    assert(refused.getMessage.contains("range scan over column t of type string"))
  }

  test("a view lives until its last holder lets go: open iterators keep it, then it is closed and deleted") {
    val dir = newDir()
    writeDb(dir, Seq((0 until 100).map(i => rawKeys.encode(key("k", i)) -> value(i).getBytes)))
    val v = view(dir, rawKeys, 100)
    val unfinished = v.pairs()
    unfinished.next()
    v.retain() // a store holding the version
    v.release() // the provider's cache lets go
    assert(valueOf(v.get(key("k", 5))) == Some(5))
    v.release() // the store too: the iterator still holds the view
    assert(dir.exists() && unfinished.size == 99, "an open iterator's view was closed under it")
    assert(!dir.exists(), "the view's directory outlived its last holder")
    val closed = intercept[IllegalStateException](v.get(key("k", 1)))
    assert(closed.getMessage.contains("the read view of store test/0/0 version 7 is closed"), closed.getMessage)
    assert(intercept[IllegalStateException](v.retain()).getMessage.contains("is closed"))

    val notADb = newDir()
    val broken = view(notADb, rawKeys, 1)
    val e = intercept[IllegalStateException](broken.get(key("k", 1)))
    assert(e.getMessage.contains(s"store test/0/0 version 7 at $notADb does not open in Spark's rocksdbjni"),
      e.getMessage)
    broken.release()
  }
}
