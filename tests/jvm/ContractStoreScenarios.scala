package org.pystatestore.tests

import java.io.File
import java.util.concurrent.{Callable, Executors, TimeUnit}

import org.apache.spark.SparkThrowable
import org.apache.spark.sql.execution.streaming.state._

/**
 * The store's basic contract: reads and writes of one version, commit and abort, reloads of every
 * version, iterators and prefix scans over the buffer and the committed base, read stores upgraded
 * to write stores, metrics and key counts.
 */
object ContractStoreScenarios {
  import ContractHarness._

  def register(): Unit = {
    scenario("get_put_remove_commit", EveryBackend) {
      val p = provider(newDir())
      val s = p.getStore(0)
      check(s.version == 0, s"version ${s.version}")
      check(s.get(key("a")) == null, "empty store returned a value")
      s.put(key("a"), value(1)); s.put(key("b"), value(2)); s.put(key("a"), value(3))
      check(intOf(s.get(key("a"))).contains(3), "latest put wins")
      s.remove(key("b"))
      check(s.get(key("b")) == null, "removed key still visible")
      check(s.metrics.numKeys == 1, s"numKeys before commit ${s.metrics.numKeys}")
      check(s.commit() == 1, "commit returns the new version")
      check(s.hasCommitted, "hasCommitted")
      val s1 = p.getStore(1)
      check(contents(s1) == Map(("a", 0) -> 3), s"version 1: ${contents(s1)}")
      s1.abort()
      p.close()
    }

    scenario("updates_after_commit_or_abort_are_refused", DefaultBackendOnly) {
      val p = provider(newDir())
      val s = p.getStore(0)
      s.put(key("a"), value(1)); s.commit()
      expectThrows[IllegalStateException]("put after commit")(s.put(key("b"), value(2)))
      expectThrows[IllegalStateException]("commit twice")(s.commit())
      s.abort() // abort after commit is harmless
      val s2 = p.getStore(1)
      s2.abort()
      expectThrows[IllegalStateException]("remove after abort")(s2.remove(key("a")))
      p.close()
    }

    scenario("put_null_is_refused", DefaultBackendOnly) {
      val p = provider(newDir())
      val s = p.getStore(0)
      expectThrows[IllegalArgumentException]("put(null)")(s.put(key("a"), null))
      s.abort(); p.close()
    }

    scenario("iterator_sees_buffer_and_base_and_allows_updates", EveryBackend) {
      val p = provider(newDir())
      commitVersion(p, 0, Map("a" -> 1, "b" -> 2, "c" -> 3))
      val s = p.getStore(1)
      s.put(key("d"), value(4)); s.put(key("a"), value(10)); s.remove(key("c"))
      check(contents(s) == Map(("a", 0) -> 10, ("b", 0) -> 2, ("d", 0) -> 4), s"merged view ${contents(s)}")
      val it = s.iterator()
      var seen = 0
      while (it.hasNext) { val pair = it.next(); s.remove(pair.key); s.put(key("new" + seen), value(seen)); seen += 1 }
      check(seen == 3, s"iterated $seen rows")
      check(contents(s).keySet.forall(_._1.startsWith("new")), s"after removing while iterating: ${contents(s)}")
      s.commit(); p.close()
    }

    scenario("write_buffer_matches_a_map_across_pages_overwrites_and_point_in_time_scans", DefaultBackendOnly) {
      // Enough writes to fill many buffer pages and grow its index, rows larger than a page,
      // overwrites, deletes of present and absent keys, and iterators and prefix scans that must
      // see the store as it was when they started while it keeps changing.
      val dir = newDir()
      val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
      val p = provider(dir, encoder = spec)
      val rnd = new scala.util.Random(7)
      val prefixes = (0 until 30).map(i => s"p$i")
      def randomKey(): (String, Int) = (prefixes(rnd.nextInt(prefixes.size)), rnd.nextInt(1500))
      var model = (1 to 3000).map(_ => randomKey() -> rnd.nextInt(1000)).toMap
      val first = p.getStore(0)
      model.foreach { case ((k, i), v) => first.put(key(k, i), value(v)) }
      first.commit(); first.release()
      def scanOf(st: ReadStateStore, pre: String): Map[(String, Int), Int] =
        st.prefixScan(prefix(pre))
          .map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
      val s = p.getStore(1)
      val big = "x" * (3 << 19) // a 1.5 MiB key: a record larger than a buffer page
      for (step <- 1 to 40000) {
        val k = if (step % 9000 == 0) (big + step, step) else randomKey()
        rnd.nextInt(10) match {
          case 0 | 1 =>
            s.remove(key(k._1, k._2)); model -= k
          case 2 | 3 =>
            check(intOf(s.get(key(k._1, k._2))) == model.get(k), s"get $k at step $step")
          case _ =>
            val v = rnd.nextInt(1000)
            s.put(key(k._1, k._2), value(v)); model += k -> v
        }
        if (step % 8000 == 0) {
          val pre = prefixes(rnd.nextInt(prefixes.size))
          val (all, scanned) = (s.iterator(), s.prefixScan(prefix(pre)))
          val (allThen, scanThen) = (model, model.filter(_._1._1 == pre))
          for (_ <- 1 to 2000) { // change the store while the scans are open
            val k2 = if (rnd.nextBoolean()) randomKey() else (pre, rnd.nextInt(1500))
            if (rnd.nextInt(3) == 0) { s.remove(key(k2._1, k2._2)); model -= k2 }
            else { val v = rnd.nextInt(1000); s.put(key(k2._1, k2._2), value(v)); model += k2 -> v }
          }
          val seen = all.map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
          check(seen == allThen, s"iterator at step $step: ${seen.size} rows, expected ${allThen.size}; " +
            s"differ on ${(seen.keySet ++ allThen.keySet).filter(x => seen.get(x) != allThen.get(x)).take(3)}")
          val seenScan =
            scanned.map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1)) -> pr.value.getInt(0)).toMap
          check(seenScan == scanThen,
            s"prefix scan of $pre at step $step: ${seenScan.size} rows, expected ${scanThen.size}")
        }
      }
      check(contents(s) == model, s"before commit: ${contents(s).size} rows, expected ${model.size}")
      check(s.metrics.numKeys == model.size, s"numKeys before commit ${s.metrics.numKeys}, expected ${model.size}")
      s.commit()
      check(s.metrics.numKeys == model.size, s"numKeys after commit ${s.metrics.numKeys}, expected ${model.size}")
      s.release(); p.close()
      val fresh = provider(dir, encoder = spec)
      val reloaded = fresh.getStore(2)
      check(contents(reloaded) == model, s"reloaded: ${contents(reloaded).size} rows, expected ${model.size}")
      prefixes.take(5).foreach { pre =>
        check(scanOf(reloaded, pre) == model.filter(_._1._1 == pre), s"reloaded prefix scan of $pre")
      }
      reloaded.abort(); fresh.close()
    }

    scenario("abort_discards_changes", DefaultBackendOnly) {
      val dir = newDir()
      val p = provider(dir)
      commitVersion(p, 0, Map("a" -> 1))
      val s = p.getStore(1)
      s.put(key("b"), value(2)); s.abort()
      check(!s.hasCommitted, "aborted store reports committed")
      check(contents(p.getStore(1)) == Map(("a", 0) -> 1), "abort leaked changes")
      check(!new File(new java.net.URI(dir).getPath, "0/0/manifests/2.json").exists(), "abort wrote a manifest")
      p.close()
    }

    scenario("reload_every_version_from_a_new_provider", EveryBackend) {
      val dir = newDir()
      val p = provider(dir)
      (1 to 6).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v), if (v > 2) Seq(s"k${v - 2}") else Nil))
      p.close()
      val fresh = provider(dir)
      for (v <- 1 to 6) {
        val expected = (math.max(1, v - 1) to v).map(i => (s"k$i", 0) -> i).toMap
        val got = contents(fresh.getStore(v))
        check(got == expected, s"version $v: $got != $expected")
      }
      // an older version can be the base of a new commit (Spark's retry of an earlier batch)
      check(commitVersion(fresh, 3, Map("x" -> 1)) == 4, "recommit from an older version")
      check(contents(fresh.getStore(4)) == Map(("k2", 0) -> 2, ("k3", 0) -> 3, ("x", 0) -> 1), "re-committed 4")
      fresh.close()
    }

    scenario("invalid_versions_fail_with_cannot_load_state_store", EveryBackend) {
      val dir = newDir()
      val p = provider(dir)
      val neg = expectThrows[Throwable]("getStore(-1)")(p.getStore(-1))
      check(neg.isInstanceOf[SparkThrowable] &&
        neg.asInstanceOf[SparkThrowable].getCondition.startsWith("CANNOT_LOAD_STATE_STORE"),
        s"getStore(-1): ${messages(neg)}")
      commitVersion(p, 0, Map("a" -> 1))
      val missing = expectThrows[Throwable]("getStore(7)")(p.getStore(7))
      check(missing.isInstanceOf[SparkThrowable] &&
        missing.asInstanceOf[SparkThrowable].getCondition.startsWith("CANNOT_LOAD_STATE_STORE"),
        s"getStore(7) error class: ${messages(missing)}")
      val text = messages(missing)
      check(text.contains("version: 7") && text.contains("manifests/7.json") && text.contains("0/0"),
        s"error does not name store, version and file: $text")
      val ro = expectThrows[Throwable]("getReadStore(-1)")(p.getReadStore(-1))
      check(ro.isInstanceOf[SparkThrowable], s"getReadStore(-1): $ro")
      p.close()
    }

    scenario("prefix_scan", EveryBackend) {
      val dir = newDir()
      val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
      val p = provider(dir, encoder = spec)
      val s = p.getStore(0)
      Seq(("a", 1), ("a", 2), ("b", 1), ("c", 5)).foreach { case (k, i) => s.put(key(k, i), value(i)) }
      def scan(st: ReadStateStore, pre: String): Set[(String, Int)] =
        st.prefixScan(prefix(pre)).map(pr => (pr.key.getUTF8String(0).toString, pr.key.getInt(1))).toSet
      check(scan(s, "a") == Set(("a", 1), ("a", 2)), s"uncommitted scan ${scan(s, "a")}")
      s.commit()
      val s1 = p.getStore(1)
      s1.put(key("a", 3), value(3)); s1.remove(key("a", 1))
      check(scan(s1, "a") == Set(("a", 2), ("a", 3)), s"mixed scan ${scan(s1, "a")}")
      check(scan(s1, "zzz").isEmpty, "unknown prefix")
      s1.commit(); p.close()
      val fresh = provider(dir, encoder = spec)
      check(scan(fresh.getStore(2), "a") == Set(("a", 2), ("a", 3)), "scan after reload from the worker")
      check(scan(fresh.getReadStore(2), "b") == Set(("b", 1)), "scan on a read store")
      val plain = provider(newDir())
      expectThrows[IllegalStateException]("prefixScan without prefix encoder")(
        plain.getStore(0).prefixScan(prefix("a")))
      fresh.close(); plain.close()
    }

    scenario("read_store_then_upgrade_to_write_store", EveryBackend) {
      val p = provider(newDir())
      commitVersion(p, 0, Map("a" -> 1))
      val pool = Executors.newSingleThreadExecutor()
      try {
        val f = pool.submit(new Callable[Long] {
          override def call(): Long = {
            val read = p.getReadStore(1)
            check(intOf(read.get(key("a"))).contains(1), "read store value")
            val write = p.upgradeReadStoreToWriteStore(read, 1, None)
            write.put(key("b"), value(2))
            val v = write.commit()
            read.release()
            v
          }
        })
        check(f.get(60, TimeUnit.SECONDS) == 2, "upgraded store commits version 2")
      } finally pool.shutdownNow()
      check(contents(p.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "upgraded commit content")
      p.close()
    }

    scenario("metrics_match_supported_custom_metrics", EveryBackend) {
      val p = provider(newDir())
      val s = p.getStore(0)
      (1 to 5).foreach(i => s.put(key(s"k$i"), value(i)))
      s.commit()
      val m = s.metrics
      check(m.numKeys == 5, s"numKeys ${m.numKeys}")
      check(m.memoryUsedBytes > 0, "memoryUsedBytes")
      val names = p.supportedCustomMetrics.map(_.name).toSet
      check(m.customMetrics.keySet.map(_.name) == names,
        s"custom metrics ${m.customMetrics.keySet.map(_.name)} vs $names")
      val byName = m.customMetrics.map { case (k, v) => k.name -> v }
      check(byName("pystatestoreBytesWritten") > 0, "bytes written")
      check(byName("pystatestoreChangedRows") == 5, s"changed rows ${byName("pystatestoreChangedRows")}")
      val info = s.getStateStoreCheckpointInfo()
      check(info.batchVersion == 1 && info.partitionId == 0 && info.stateStoreCkptId.isEmpty, s"checkpoint info $info")
      p.close()
    }

    scenario("key_counts_come_from_spark_reads_not_lookups", EveryBackend) {
      val p = provider(newDir())
      commitVersion(p, 0, Map("a" -> 1, "b" -> 2, "c" -> 3))
      // Spark's aggregation: a read store is upgraded first, then every key is read, then written.
      val read = p.getReadStore(1)
      val write = p.upgradeReadStoreToWriteStore(read, 1, None)
      for (k <- Seq("a", "x", "y")) { read.get(key(k)); write.put(key(k), value(9)) }
      write.get(key("b")); write.remove(key("b")) // read, then removed
      write.remove(key("zz")) // removing a key that never existed: not counted
      write.put(key("c"), value(30)) // written without a read: looked up at commit
      check(write.commit() == 2, "commit")
      val m = write.metrics
      check(m.numKeys == 4, s"numKeys ${m.numKeys}, expected 4 (a c x y)")
      val looked = m.customMetrics.collectFirst { case (k, v) if k.name == "pystatestoreKeysLookedUpAtCommit" => v }
      check(looked.contains(2L), s"keys looked up at commit: $looked, expected 2 (c and zz, written unread)")
      read.release(); write.release()
      check(contents(provider(p.stateStoreId.checkpointRootLocation).getStore(2)).keySet ==
        Set(("a", 0), ("c", 0), ("x", 0), ("y", 0)), "version 2")
      p.close()
    }
  }
}
