package org.pystatestore

import scala.collection.mutable

import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.scalatest.funsuite.AnyFunSuite

import org.pystatestore.TestRows._

/**
 * The write buffer alone (no provider, no worker), judged by a map kept beside it: what reads see,
 * what each point-in-time view and prefix scan holds however the buffer changed since, the commit's
 * pass over the newest writes and what the read marks knew of the base. tests/jvm/ContractSuite.scala
 * drives the same buffer through the provider; here every call of its own is checked.
 */
class WriteBufferSuite extends AnyFunSuite {
  type Key = (String, Int)

  private def withBuffer[T](codec: KeyCodec)(body: WriteBuffer => T): T = {
    val buffer = new WriteBuffer(codec, valueSchema.length)
    try body(buffer) finally buffer.close()
  }

  /** A view's entries: key -> value, None for a delete. */
  private def entries(it: Iterator[(UnsafeRow, UnsafeRow)]): Seq[(Key, Option[Int])] =
    it.map { case (k, v) => keyOf(k) -> valueOf(v) }.toVector

  /** A random history against the model; `prefixScans`: check the per-prefix chains too. */
  private def matchesTheModel(codec: KeyCodec, prefixScans: Boolean, seed: Int): Unit = withBuffer(codec) { buffer =>
    val rnd = new scala.util.Random(seed)
    val prefixes = (0 until 20).map(i => s"p$i")
    def randomKey(): Key = (prefixes(rnd.nextInt(prefixes.size)), rnd.nextInt(400))
    val base = (1 to 3000).map(_ => randomKey() -> rnd.nextInt(1000)).toMap // the committed version
    val written = mutable.Map.empty[Key, Option[Int]] // newest write per key; None: a delete
    val knownInBase = mutable.Map.empty[Key, Boolean] // what a key's first touch, a read or a mark, learnt
    val touched = mutable.Set.empty[Key]
    var writes = 0L
    case class View(at: Long, expected: Map[Key, Option[Int]])
    val views = mutable.ArrayBuffer.empty[View]
    // An iterator opened at a view and read a step at a time while the buffer keeps changing.
    var open: Option[(Iterator[(UnsafeRow, UnsafeRow)], Map[Key, Option[Int]])] = None
    val openSeen = mutable.ArrayBuffer.empty[(Key, Option[Int])]

    def write(k: Key, v: Option[Int]): Unit = {
      buffer.write(key(k._1, k._2), v.map(value).orNull)
      written(k) = v
      touched += k
      writes += 1
    }
    for (step <- 1 to 20000) {
      // Keys larger than a page now and then (the first pages are 4 KiB and grow): a page of their own.
      val k = if (step % 4000 == 0) ("p3" + "x" * (20000 + step), step) else randomKey()
      rnd.nextInt(20) match {
        case n if n < 8 => write(k, Some(rnd.nextInt(1000)))
        case n if n < 11 => write(k, None)
        case n if n < 17 =>
          var askedBase = false
          val got = buffer.read(key(k._1, k._2), _ => { askedBase = true; base.get(k).map(value).orNull })
          val expected = written.getOrElse(k, base.get(k))
          assert(valueOf(got) == expected, s"read of $k at step $step")
          assert(askedBase == !written.contains(k), s"read of $k at step $step asked the base: $askedBase")
          if (!touched(k)) knownInBase(k) = base.contains(k)
          touched += k
        case n if n < 18 =>
          buffer.mark(key(k._1, k._2), base.contains(k))
          if (!touched(k)) knownInBase(k) = base.contains(k)
          touched += k
        case _ =>
          if (step % 80 == 0) views += View(buffer.now, written.toMap)
      }
      if (step % 2500 == 0) {
        open.foreach { case (it, expected) =>
          openSeen ++= it.map { case (r, v) => keyOf(r) -> valueOf(v) }
          assertSameEntries(openSeen.toSeq, expected, s"an iterator read across writes, step $step")
        }
        openSeen.clear()
        val it = buffer.entriesAt(buffer.now)
        open = Some(it -> written.toMap)
        var half = written.size / 2
        while (half > 0 && it.hasNext) { val (r, v) = it.next(); openSeen += keyOf(r) -> valueOf(v); half -= 1 }
      }
    }
    assert(views.size > 12, s"${views.size} views taken: too few to judge them")
    for ((View(at, expected), i) <- views.zipWithIndex) {
      assertSameEntries(entries(buffer.entriesAt(at)), expected, s"view $i (at $at)")
      if (i % 3 == 0) {
        val sorted = buffer.sortedEntriesAt(at)
        assertSameEntries(sorted.map(e => keyOf(e._2) -> valueOf(e._3)), expected, s"sorted view $i")
        assert(ascending(sorted.map(_._1)), s"sorted view $i is not in unsigned byte order")
      }
      val probes = expected.keys.take(30) ++ Iterator.continually(randomKey()).take(30)
      probes.foreach(k => assert(buffer.writtenAt(key(k._1, k._2), at) == expected.contains(k), s"writtenAt $k, view $i"))
      if (prefixScans && i % 3 == 1) prefixes.take(6).foreach { p =>
        val scan = codec.scanPrefix(prefix(p))
        val inPrefix = expected.filter(_._1._1 == p)
        assertSameEntries(entries(buffer.entriesAt(at, scan)), inPrefix, s"prefix scan of $p, view $i")
        val sortedScan = buffer.sortedEntriesAt(at, scan)
        assertSameEntries(sortedScan.map(e => keyOf(e._2) -> valueOf(e._3)), inPrefix,
          s"sorted prefix scan of $p, view $i")
      }
    }

    // The commit's pass: each written key once, its newest write, and the base as its read mark knew it.
    for (sorted <- Seq(false, true)) {
      val visited = mutable.ArrayBuffer.empty[(Array[Byte], Key, Option[Int])]
      buffer.foreachWrite(sorted) { (flags, bytes, keyAt, keyLength, valueAt, valueLength) =>
        val k = keyOf(buffer.decodeKey(bytes, keyAt, keyLength))
        val v = if (WriteBuffer.isDelete(flags)) None else valueOf(buffer.decodeValue(bytes, valueAt, valueLength))
        var lookedUp = false
        val inBase = WriteBuffer.presentInBase(flags) { lookedUp = true; false }
        knownInBase.get(k) match {
          case Some(known) => assert(!lookedUp && inBase == known, s"$k: its read mark said $known")
          case None => assert(lookedUp, s"$k was written unread, yet the buffer claims to know the base")
        }
        visited += ((java.util.Arrays.copyOfRange(bytes, keyAt, keyAt + keyLength), k, v))
      }
      assertSameEntries(visited.map(e => e._2 -> e._3).toSeq, written.toMap, s"the commit's pass (sorted=$sorted)")
      if (sorted) assert(ascending(visited.map(_._1).toSeq), "the sorted pass is not in unsigned byte order")
    }
    assert(buffer.numWrites == writes)
  }

  test("reads, writes, deletes and marks match a map; so does every point-in-time view taken along the way") {
    matchesTheModel(rawKeys, prefixScans = false, seed = 3)
  }

  test("prefix-scan keys: the same, and each prefix's chain scans exactly that prefix at every view") {
    matchesTheModel(prefixKeys, prefixScans = true, seed = 5)
  }

  test("a read mark is folded into the write that follows it, keeping what the mark knew of the base") {
    // Spark reads a key, then writes it: the write takes the place of the read mark (one record per
    // key, not two) but keeps what the mark knew of the base, and a point-in-time view taken
    // between the read and the write still does not see the write.
    val n = 100000
    withBuffer(rawKeys) { folded =>
      withBuffer(rawKeys) { writesOnly =>
        for (i <- 0 until n) {
          val k = key("k" + i, i)
          assert(valueOf(folded.read(k, _ => if (i % 3 == 0) value(-i) else null)) ==
            (if (i % 3 == 0) Some(-i) else None), s"read of k$i from the base")
          folded.write(k, if (i % 5 == 4) null else value(i))
          writesOnly.write(k, if (i % 5 == 4) null else value(i))
        }
        // Slack for a mark left at the end of a page when its write did not fit there (a few pages);
        // a mark kept per key would be ~4 MB more.
        assert(folded.memoryBytes <= writesOnly.memoryBytes + (64 << 10),
          s"$n keys read then written hold ${folded.memoryBytes} bytes, written only ${writesOnly.memoryBytes}")
        val seen = mutable.Map.empty[Int, (Boolean, Option[Int])]
        folded.foreachWrite() { (flags, bytes, keyAt, keyLength, valueAt, valueLength) =>
          val i = folded.decodeKey(bytes, keyAt, keyLength).getInt(1)
          val v = if (WriteBuffer.isDelete(flags)) None
            else Some(folded.decodeValue(bytes, valueAt, valueLength).getInt(0))
          assert(!seen.contains(i), s"k$i visited twice")
          seen(i) = (WriteBuffer.presentInBase(flags)(fail(s"k$i: the read mark's answer was lost")), v)
        }
        assert(seen.size == n)
        for (i <- 0 until n) assert(seen(i) == ((i % 3 == 0, if (i % 5 == 4) None else Some(i))), s"k$i")
        val k = key("k" + n, n)
        folded.read(k, _ => null)
        val before = folded.now
        folded.write(k, value(1))
        val then = folded.entriesAt(before).map(_._1.getInt(1)).toSet
        val seesTheWrite = then.contains(n)
        assert(then.size == n && !seesTheWrite, "a view taken between a read and a write")
        assert(folded.entriesAt(folded.now).size == n + 1, "the newest view misses writes")
        assert(valueOf(folded.read(k, _ => fail("read from the base"))) == Some(1), "read after a write")
      }
    }
  }

  test("it reports what its records use, not the pages it maps") {
    // Past its first pages a buffer takes pages of 32 MiB of address space (so glibc maps each
    // apart and unmaps it when freed), of which only what the records fill becomes resident. The
    // memory it reports must follow the bytes written: between the keys' and values' bytes and those
    // plus a generous per-record overhead, however little of its newest page is used.
    withBuffer(rawKeys) { buffer =>
      var payload = 0L
      for (i <- 0 until 200000) {
        val (k, v) = (key("k" + i, i), value(i))
        buffer.write(k, v)
        payload += k.getSizeInBytes + v.getSizeInBytes
      }
      val reported = buffer.memoryBytes
      val bound = payload + 64L * 200000 + 48L * 200000 + (1L << 20) // headers, index slots, small pages
      assert(reported >= payload && reported <= bound, s"reports $reported bytes for $payload bytes of keys and values")
      assert(valueOf(buffer.read(key("k0", 0), _ => null)) == Some(0))
      assert(valueOf(buffer.read(key("k199999", 199999), _ => null)) == Some(199999))
    }
  }

  test("a released buffer refuses every call, and the rows it handed out stay readable") {
    val buffer = new WriteBuffer(prefixKeys, valueSchema.length)
    buffer.write(key("a", 1), value(7))
    val row = buffer.read(key("a", 1), _ => fail("read from the base"))
    val view = buffer.entriesAt(buffer.now)
    buffer.close()
    assert(buffer.memoryBytes == 0L && !buffer.isOpen)
    assert(valueOf(row) == Some(7), "a row handed out before close")
    val calls: Seq[(String, () => Any)] = Seq(
      "read" -> (() => buffer.read(key("a", 1), _ => null)),
      "write" -> (() => buffer.write(key("b", 1), value(1))),
      "mark" -> (() => buffer.mark(key("c", 1), present = true)),
      "now" -> (() => buffer.now),
      "a view opened before" -> (() => view.toList),
      "foreachWrite" -> (() => buffer.foreachWrite()((_, _, _, _, _, _) => ())))
    for ((name, call) <- calls) {
      val e = intercept[IllegalStateException](call())
      assert(e.getMessage.contains("write buffer was released"), s"$name: ${e.getMessage}")
    }
    buffer.close() // a second close is harmless
  }
}
