package org.pystatestore.tests

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

/**
 * Column families (transformWithState's layout; rocksdb backend): families kept apart across
 * commits, restarts and removal, key counts, several values per key, range-scan order, and what
 * the memory backend and a store without families refuse.
 */
object ContractFamilyScenarios {
  import ContractHarness._

  private val rangeKeySchema: StructType = StructType(Seq(
    StructField("l", LongType), StructField("d", DoubleType), StructField("s", StringType)))
  private val rangeKeyProj = UnsafeProjection.create(rangeKeySchema)
  private def rangeKey(l: java.lang.Long, d: java.lang.Double, s: String): UnsafeRow = rangeKeyProj.synchronized {
    rangeKeyProj(InternalRow(l, d, UTF8String.fromString(s))).copy()
  }
  /** The families these scenarios declare: plain, prefix-scan, range-scan and several values per key. */
  private def declareFamilies(s: StateStore, order: Seq[String] = Seq("plain", "prefixed", "ranged", "listed")): Unit =
    order.foreach {
      case "plain" => s.createColFamilyIfAbsent("plain", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
      case "prefixed" => s.createColFamilyIfAbsent("prefixed", keySchema, valueSchema,
        PrefixKeyScanStateEncoderSpec(keySchema, 1))
      case "ranged" => s.createColFamilyIfAbsent("ranged", rangeKeySchema, valueSchema,
        RangeKeyScanStateEncoderSpec(rangeKeySchema, Seq(0, 1)))
      case "listed" => s.createColFamilyIfAbsent("listed", keySchema, valueSchema,
        NoPrefixKeyStateEncoderSpec(keySchema), useMultipleValuesPerKey = true)
    }
  private def familyContents(s: ReadStateStore, family: String): Map[(String, Int), Int] =
    s.iterator(family).map(p => (p.key.getUTF8String(0).toString, p.key.getInt(1)) -> p.value.getInt(0)).toMap
  private def valuesOf(s: ReadStateStore, k: UnsafeRow): Seq[Int] =
    s.valuesIterator(k, "listed").map(_.getInt(0)).toSeq

  def register(): Unit = {
    scenario("column_families_need_rocksdb_and_stray_calls_are_refused_clearly", DefaultBackendOnly) {
      // The shim's init refuses families on the memory backend (no worker is asked): one backend tells.
      val onHeap = sqlConf(ConfPrefix + "backend" -> "memory")
      val e = expectThrows[Throwable]("init with column families on the memory backend")(
        provider(newDir(), conf = onHeap, useColumnFamilies = true))
      check(messages(e).contains("backend=rocksdb"), s"column family error: ${messages(e)}")
      val p = provider(newDir())
      val s = p.getStore(0)
      val mv = expectThrows[Throwable]("merge")(s.merge(key("a"), value(1)))
      check(messages(mv).contains("multiple values"), s"merge error: ${messages(mv)}")
      val cf = expectThrows[Throwable]("get on another family")(s.get(key("a"), "other"))
      check(messages(cf).toLowerCase.contains("column famil"), s"cf error: ${messages(cf)}")
      s.abort(); p.close()
    }

    scenario("column_families_keep_their_keys_apart_across_commits_restarts_and_removal", BothCommitModes) {
      val dir = newDir()
      val p = provider(dir, useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      s.put(key("a"), value(1), "plain"); s.put(key("a"), value(2), "prefixed"); s.put(key("b"), value(3), "prefixed")
      s.put(key("x"), value(9)) // Spark's default family
      check(intOf(s.get(key("a"), "plain")).contains(1) && intOf(s.get(key("a"), "prefixed")).contains(2),
        "one key, two families, two values")
      check(s.prefixScan(prefix("b"), "prefixed").map(_.value.getInt(0)).toSeq == Seq(3), "prefix scan in a family")
      s.commit()
      p.close()
      // A restart declares the families in another order: they keep their ids (the checkpoint's registry).
      val q = provider(dir, useColumnFamilies = true)
      val s1 = q.getStore(1)
      declareFamilies(s1, Seq("listed", "ranged", "prefixed", "plain"))
      check(familyContents(s1, "plain") == Map(("a", 0) -> 1), s"plain after restart: ${familyContents(s1, "plain")}")
      check(familyContents(s1, "prefixed") == Map(("a", 0) -> 2, ("b", 0) -> 3), "prefixed after restart")
      check(intOf(s1.get(key("x"))).contains(9), "default family after restart")
      check(s1.removeColFamilyIfExists("plain"), "removing an existing family says so")
      check(!s1.removeColFamilyIfExists("never"), "removing an absent family says so")
      check(s1.get(key("a"), "plain") == null, "a removed family reads empty")
      s1.commit()
      val s2 = q.getStore(2)
      declareFamilies(s2)
      check(familyContents(s2, "plain").isEmpty, s"removed family after commit: ${familyContents(s2, "plain")}")
      check(familyContents(s2, "prefixed").size == 2, "other families untouched by a removal")
      s2.put(key("c"), value(5), "plain")
      s2.commit()
      val r = q.getReadStore(3)
      check(familyContents(r, "plain") == Map(("c", 0) -> 5), s"re-created family: ${familyContents(r, "plain")}")
      r.abort()
      q.close()
    }

    scenario("num_keys_leaves_internal_families_out_as_spark_counts_them", BothCommitModes) {
      val dir = newDir()
      def declare(s: StateStore): Unit = {
        declareFamilies(s, Seq("plain", "listed"))
        s.createColFamilyIfAbsent("$timers", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema),
          isInternal = true)
      }
      val p = provider(dir, useColumnFamilies = true)
      val s0 = p.getStore(0)
      declare(s0)
      val reserved = expectThrows[Throwable]("a user's family named with $")(
        s0.createColFamilyIfAbsent("$mine", keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema)))
      check(messages(reserved).contains("RESERVED_CHARS"), s"reserved name error: ${messages(reserved)}")
      s0.put(key("a"), value(1), "plain"); s0.put(key("b"), value(2), "plain")
      s0.merge(key("a"), value(3), "listed"); s0.merge(key("a"), value(4), "listed") // one key, two values
      Seq("t1", "t2", "t3").foreach(t => s0.put(key(t), value(0), "$timers"))
      s0.commit()
      // Spark's RocksDB counts the keys of users' families only (a list is one key).
      check(s0.metrics.numKeys == 3, s"numKeys after the first commit: ${s0.metrics.numKeys}, expected 3")
      p.close()
      val q = provider(dir, useColumnFamilies = true) // a restart: the counts come from the checkpoint
      val s1 = q.getStore(1)
      declare(s1)
      check(s1.metrics.numKeys == 3, s"numKeys after a restart: ${s1.metrics.numKeys}, expected 3")
      s1.remove(key("t1"), "$timers"); s1.put(key("t4"), value(0), "$timers"); s1.put(key("c"), value(5), "plain")
      s1.commit()
      check(s1.metrics.numKeys == 4, s"numKeys after timers moved and a key was added: ${s1.metrics.numKeys}")
      q.close()
      val again = provider(dir, useColumnFamilies = true)
      val r = again.getStore(2)
      check(r.metrics.numKeys == 4, s"numKeys of version 2 after a restart: ${r.metrics.numKeys}, expected 4")
      r.abort()
      again.close()
    }

    scenario("a_removed_familys_id_is_never_given_again", DefaultBackendOnly) {
      val p = provider(newDir(), useColumnFamilies = true)
      def declare(s: StateStore, name: String): Unit =
        s.createColFamilyIfAbsent(name, keySchema, valueSchema, NoPrefixKeyStateEncoderSpec(keySchema))
      val s0 = p.getStore(0)
      declare(s0, "old")
      s0.put(key("a"), value(1), "old"); s0.put(key("b"), value(2), "old")
      s0.commit()
      val s1 = p.getStore(1)
      check(s1.removeColFamilyIfExists("old"), "old existed")
      s1.commit()
      val s2 = p.getStore(2)
      declare(s2, "new")
      s2.put(key("c"), value(3), "new")
      s2.commit()
      // The change feed of the new family over every version: had it taken the removed family's
      // id, the removed family's puts and deletes would show as its own.
      val feed: Iterator[(Any, UnsafeRow, UnsafeRow, Long)] = p.getStateStoreChangeDataReader(1, 3, Some("new"), None)
      val rows = feed.map { case (kind, k, _, batch) => (kind.toString, k.getUTF8String(0).toString, batch) }.toList
      check(rows.map(r => (r._2, r._3)) == List(("c", 2L)), s"change feed of the new family: $rows")
      p.close()
    }

    scenario("several_values_per_key_merge_put_and_remove_across_commits", DefaultBackendOnly) {
      val p = provider(newDir(), useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      s.merge(key("a"), value(1), "listed"); s.merge(key("a"), value(2), "listed")
      s.mergeList(key("a"), Array(value(3), value(4)), "listed")
      s.putList(key("b"), Array(value(7), value(8)), "listed")
      check(valuesOf(s, key("a")) == Seq(1, 2, 3, 4), s"merged values: ${valuesOf(s, key("a"))}")
      s.commit()
      val s1 = p.getStore(1)
      declareFamilies(s1)
      check(valuesOf(s1, key("a")) == Seq(1, 2, 3, 4) && valuesOf(s1, key("b")) == Seq(7, 8), "values after commit")
      s1.merge(key("b"), value(9), "listed")
      s1.putList(key("a"), Array(value(5)), "listed")
      s1.remove(key("b"), "listed")
      s1.merge(key("b"), value(10), "listed")
      s1.commit()
      val r = p.getReadStore(2)
      check(valuesOf(r, key("a")) == Seq(5) && valuesOf(r, key("b")) == Seq(10),
        s"values at 2: ${valuesOf(r, key("b"))}")
      check(valuesOf(r, key("none")).isEmpty, "no values for an absent key")
      val misuse = expectThrows[Throwable]("merge into a single-value family")(
        p.getStore(2).merge(key("a"), value(1), "plain"))
      check(messages(misuse).contains("useMultipleValuesPerKey"), s"merge error: ${messages(misuse)}")
      r.abort(); p.close()
    }

    scenario("range_scan_families_iterate_in_the_order_of_their_ordering_columns", DefaultBackendOnly) {
      // The referee: Scala's orderings on the values themselves (nulls last, doubles by
      // java.lang.Double.compare: -0.0 before 0.0, NaN after +Infinity), never the byte codec.
      val rnd = new scala.util.Random(11)
      val longs: Seq[java.lang.Long] =
        Seq[java.lang.Long](null, Long.MinValue, Long.MaxValue, -1L, 0L, 1L, -256L, 255L) ++
        Seq.fill(12)(java.lang.Long.valueOf(rnd.nextLong() >> rnd.nextInt(60)))
      val doubles: Seq[java.lang.Double] = Seq[java.lang.Double](null, -0.0, 0.0, Double.NaN, Double.NegativeInfinity,
        Double.PositiveInfinity, -1.5, 1.5, Double.MinPositiveValue, -Double.MaxValue)
      val rows = (for (l <- longs.distinct; d <- doubles) yield (l, d)).toIndexedSeq
      // Indices, not values: Scala's == on boxed doubles takes -0.0 for 0.0 and NaN for nothing.
      val want = rows.indices.sortWith { (i, j) =>
        val ((l1, d1), (l2, d2)) = (rows(i), rows(j))
        def nullsLast[T](a: T, b: T)(cmp: (T, T) => Int): Int =
          if (a == null && b == null) 0 else if (a == null) 1 else if (b == null) -1 else cmp(a, b)
        val byLong = nullsLast(l1, l2)((x, y) => java.lang.Long.compare(x, y))
        (if (byLong != 0) byLong else nullsLast(d1, d2)((x, y) => java.lang.Double.compare(x, y))) < 0
      }
      val p = provider(newDir(), useColumnFamilies = true)
      val s = p.getStore(0)
      declareFamilies(s)
      val (first, second) = rnd.shuffle(rows.indices.toList).splitAt(rows.length / 2)
      first.foreach { i => s.put(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), value(i), "ranged") }
      s.commit()
      val s1 = p.getStore(1)
      declareFamilies(s1)
      second.foreach { i => s1.put(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), value(i), "ranged") }
      def order(st: ReadStateStore): Seq[Int] = st.iterator("ranged").map(_.value.getInt(0)).toSeq
      check(order(s1) == want, s"buffer merged with the base: ${order(s1).take(8)} vs ${want.take(8)}")
      val dropped = want.filter(_ % 3 == 0).toSet
      dropped.foreach { i => s1.remove(rangeKey(rows(i)._1, rows(i)._2, s"r$i"), "ranged") }
      check(order(s1) == want.filterNot(dropped), s"deletes hide base pairs before commit: ${order(s1).take(8)}")
      val rewritten = first.filterNot(dropped).head // a base key written again: seen once, with its new value
      s1.put(rangeKey(rows(rewritten)._1, rows(rewritten)._2, s"r$rewritten"), value(rewritten), "ranged")
      check(order(s1) == want.filterNot(dropped), s"a rewritten base key is seen once: ${order(s1).take(8)}")
      s1.commit()
      val r = p.getReadStore(2)
      check(order(r) == want.filterNot(dropped), s"after commit: ${order(r).take(8)}")
      check(r.iterator("ranged").forall(pr => pr.key.getUTF8String(2).toString == s"r${pr.value.getInt(0)}"),
        "keys decode whole")
      r.abort(); p.close()
    }
  }
}
