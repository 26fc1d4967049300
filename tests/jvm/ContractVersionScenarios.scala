package org.pystatestore.tests

import java.io.File
import java.nio.file.Files
import java.util.concurrent.{Callable, Executors, TimeUnit}

import scala.collection.mutable
import scala.jdk.CollectionConverters._

import org.apache.spark.sql.execution.streaming.state._

import org.pystatestore.StateWorker

/**
 * Versions over time: retention and the maintenance that applies it (alone, concurrent with
 * commits, against a commit slower than the orphan grace), attempts at one version (checkpoint ids
 * of format v2), reads that outlive retention, and every layout a compacting store writes read back.
 */
object ContractVersionScenarios {
  import ContractHarness._

  /** Read views of this JVM whose directory name says they hold `version` (rocksdb backend). */
  private def viewDirsOf(version: Long): Seq[String] =
    Option(StateWorker.viewsDir.list()).map(_.toSeq).getOrElse(Nil).filter(_.startsWith(s"v$version-"))

  def register(): Unit = {
    scenario("maintenance_applies_min_batches_to_retain", EveryBackend) {
      val dir = newDir()
      val conf = retainTwoConf()
      val p = provider(dir, conf = conf)
      def manifests = manifestsIn(dir)
      if (changelogCommits) {
        // Maintenance (as Spark's thread runs it between batches) makes a snapshot every 2 versions.
        // While the newest snapshot of a retained version's chain is younger than the grace period,
        // the chain back to the one before it stays, for restores that were walking it.
        (1 to 10).foreach { v => commitVersion(p, v - 1, Map(s"k$v" -> v)); p.doMaintenance() }
        check(manifests == Seq("10.json", "6.json", "7.json", "8.json", "9.json"),
          s"manifests after maintenance within the grace period: $manifests")
        Thread.sleep(10500)
      } else {
        (1 to 10).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v)))
      }
      p.doMaintenance()
      check(manifests == Seq("10.json", "8.json", "9.json"), s"manifests after maintenance: $manifests")
      val fresh = provider(dir, conf = conf)
      check(contents(fresh.getStore(8)).size == 8, "retained version 8 loads")
      val gone = expectThrows[Throwable]("load of removed version 5")(fresh.getStore(5))
      check(messages(gone).contains("version: 5"), s"removed version error: ${messages(gone)}")
      p.close(); fresh.close()
    }

    scenario("a_provider_that_only_reads_never_deletes", DefaultBackendOnly) {
      val dir = newDir()
      // Snapshot commits: every version stands alone, so retention can drop all but the newest three.
      val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "2",
        "spark.sql.streaming.stateStore.pystatestore.commitMode" -> "snapshot")
      val writer = provider(dir, conf = conf)
      (1 to 6).foreach(v => commitVersion(writer, v - 1, Map(s"k$v" -> v)))
      val manifests = new File(new java.net.URI(dir).getPath, "0/0/manifests")
      val reader = provider(dir, conf = conf)
      check(contents(reader.getReadStore(6)).size == 6, "reader sees version 6")
      reader.doMaintenance()
      check(manifests.list().length == 6, s"a read-only provider deleted files: ${manifests.list().toSeq}")
      writer.doMaintenance()
      check(manifests.list().length == 3, s"the writer's maintenance applies retention: ${manifests.list().toSeq}")
      reader.close(); writer.close()
    }

    // ---- checkpoint format v2: every attempt of a version is loadable by its id ----
    scenario("checkpoint_ids_name_every_attempt_across_restarts", EveryBackend) {
      val dir = newDir()
      val v2 = sqlConf("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "2")
      def commitOn(
          p: StateStoreProvider, base: Long, id: Option[String], puts: Map[String, Int]): StateStoreCheckpointInfo = {
        val s = p.getStore(base, id)
        puts.foreach { case (k, v) => s.put(key(k), value(v)) }
        try { s.commit(); s.getStateStoreCheckpointInfo() } finally s.release()
      }
      def read(p: StateStoreProvider, version: Long, id: String): Map[(String, Int), Int] = {
        val r = p.getReadStore(version, Some(id))
        try contents(r) finally r.release()
      }
      val p = provider(dir, conf = v2)
      val first = commitOn(p, 0, None, Map("a" -> 1))
      check(first.batchVersion == 1 && first.partitionId == 0 && first.baseStateStoreCkptId.isEmpty &&
        first.stateStoreCkptId.exists(_.matches("[0-9a-f]{32}")), s"version 1 info $first")
      val id1 = first.stateStoreCkptId.get
      // Two attempts at version 2 (a retried or speculative task): both stay, each under its id.
      val b = commitOn(p, 1, Some(id1), Map("b" -> 2))
      val c = commitOn(p, 1, Some(id1), Map("c" -> 3))
      check(b.baseStateStoreCkptId.contains(id1) && c.baseStateStoreCkptId.contains(id1), s"bases $b $c")
      val (idB, idC) = (b.stateStoreCkptId.get, c.stateStoreCkptId.get)
      check(idB != idC, s"two attempts got one id $idB")
      // Version 3 on the attempt that did not commit last: what Spark does when its commit log names it.
      val d = commitOn(p, 2, Some(idB), Map("d" -> 4))
      check(d.batchVersion == 3 && d.baseStateStoreCkptId.contains(idB), s"version 3 info $d")
      p.close()
      val again = provider(dir, conf = v2) // a restart: nothing cached
      check(read(again, 2, idB) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"attempt B ${read(again, 2, idB)}")
      check(read(again, 2, idC) == Map(("a", 0) -> 1, ("c", 0) -> 3), s"attempt C ${read(again, 2, idC)}")
      check(read(again, 3, d.stateStoreCkptId.get) == Map(("a", 0) -> 1, ("b", 0) -> 2, ("d", 0) -> 4),
        s"version 3 ${read(again, 3, d.stateStoreCkptId.get)}")
      // After reading C, a write store on B must not reuse C (cached at the same version).
      val onB = again.getStore(2, Some(idB))
      check(contents(onB) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"write store on B ${contents(onB)}")
      onB.abort(); onB.release()
      val unknown = "0123456789abcdef0123456789abcdef"
      val missing = expectThrows[Throwable]("an id never committed")(again.getReadStore(2, Some(unknown)))
      check(messages(missing).contains(s"manifests/2-$unknown.json"),
        s"missing id error: ${messages(missing)}")
      val forged = expectThrows[Throwable]("an id that is a path")(again.getReadStore(2, Some("../../x")))
      check(messages(forged).contains("not one pystatestore writes"), s"forged id error: ${messages(forged)}")
      again.close()
    }

    scenario("two_attempts_at_one_version_the_last_wins_and_the_loser_reloads", EveryBackend) {
      val dir = newDir()
      val first = provider(dir)
      val second = provider(dir) // another executor's provider of the same store
      commitVersion(first, 0, Map("a" -> 1))
      check(commitVersion(first, 1, Map("b" -> 1)) == 2, "first attempt at version 2")
      check(commitVersion(second, 1, Map("b" -> 2)) == 2, "second attempt at version 2 (Spark's retry)")
      check(contents(provider(dir).getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "the last manifest wins")
      // The first provider's cached version 2 is an attempt the checkpoint no longer holds: building
      // version 3 on it must fail, and the retried task must see the winning attempt.
      val stale = first.getStore(2)
      stale.put(key("c"), value(3))
      val refused = expectThrows[Throwable]("commit on a replaced base")(stale.commit())
      check(messages(refused).contains("now holds attempt"), s"refusal should explain: ${messages(refused)}")
      stale.abort()
      check(contents(first.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "the retry reloads the winner")
      check(commitVersion(first, 2, Map("c" -> 3)) == 3, "the retry commits")
      check(contents(provider(dir).getStore(3)) == Map(("a", 0) -> 1, ("b", 0) -> 2, ("c", 0) -> 3), "version 3")
      first.close(); second.close()
    }

    scenario("maintenance_concurrent_with_commits_loses_nothing", EveryBackend) {
      val dir = newDir()
      val conf = retainTwoConf()
      val writer = provider(dir, conf = conf)
      val gc = provider(dir, conf = conf) // another instance that also wrote, so its maintenance deletes
      commitVersion(gc, 0, Map("seed" -> 0))
      val stop = new java.util.concurrent.atomic.AtomicBoolean(false)
      val completedRuns = new java.util.concurrent.atomic.AtomicInteger(0)
      val pool = Executors.newSingleThreadExecutor()
      val maintenance = pool.submit(new Callable[Int] {
        override def call(): Int = {
          while (!stop.get) { gc.doMaintenance(); writer.doMaintenance(); completedRuns.incrementAndGet() }
          completedRuns.get
        }
      })
      // Every fourth commit waits for a maintenance run to finish after the previous wait, so GC
      // interleaves with the commits however slow maintenance is next to a commit on this machine.
      var seenRuns = 0
      def awaitAnotherRun(v: Int): Unit = {
        awaitCondition(completedRuns.get > seenRuns, maintenance.isDone)
        if (maintenance.isDone) maintenance.get() // a failed run: its exception is the finding
        check(completedRuns.get > seenRuns, s"no maintenance run finished within 60 s before committing version $v")
        seenRuns = completedRuns.get
      }
      try {
        (2 to 25).foreach { v =>
          if (v % 4 == 2 && v > 2) awaitAnotherRun(v)
          commitVersion(writer, v - 1, Map(s"k$v" -> v), if (v > 3) Seq(s"k${v - 2}") else Nil)
        }
      } finally stop.set(true)
      val runs = maintenance.get(60, TimeUnit.SECONDS)
      pool.shutdownNow()
      check(runs > 3, s"maintenance ran only $runs times")
      val storeRoot = new File(new java.net.URI(dir).getPath, "0/0")
      // With changelog commits version 23's chain starts at the newest snapshot at or before it, which
      // depends on when the maintenance runs happened to fall; while that snapshot is younger than
      // the grace, the chain back to the snapshot before it stays too (this scenario does not wait
      // the grace out: maintenance_applies_min_batches_to_retain does). Older versions must go. Read
      // before the last runs: a snapshot still being made may land later, and shortens the chain.
      val oldestNeeded = if (changelogCommits) {
        val snapshots = Option(new File(storeRoot, "snapshots").list()).toSeq.flatten.map(_.takeWhile(_ != '-').toInt)
        snapshots.filter(_ <= 23).sorted.takeRight(2).headOption.getOrElse(1)
      } else 23
      writer.doMaintenance() // a snapshot of version 25, if the loop made none
      writer.doMaintenance()
      val fresh = provider(dir, conf = conf)
      for (v <- 23 to 25) {
        val expected = Map(("seed", 0) -> 0) ++ (math.max(2, v - 1) to v).map(i => (s"k$i", 0) -> i)
        check(contents(fresh.getStore(v)) == expected,
          s"version $v after concurrent GC: ${contents(fresh.getStore(v))}")
      }
      val manifests = new File(storeRoot, "manifests").list().sorted.toSeq
      val versions = manifests.map(_.stripSuffix(".json").toInt).sorted
      check(versions.takeRight(3) == Seq(23, 24, 25) && versions.head >= oldestNeeded, s"retention applied: $manifests")
      writer.close(); gc.close(); fresh.close()
    }

    scenario("a_commit_slower_than_the_orphan_grace_keeps_its_files_against_concurrent_gc", EveryBackend) {
      // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) stalls the first commit of any store
      // whose directory contains "slow-commit" for 14 s after its uploads: longer than the smallest
      // orphan grace (10 s), while another instance of the store collects garbage all along. Only the
      // commit's lease keeps its uploaded files from being taken for a crashed attempt's orphans.
      val dir = Files.createTempDirectory(workDir, "slow-commit").toUri.toString
      // Without local recovery copies, which would mask files lost from the checkpoint; with the
      // changes of a changelog commit in a file of their own, never inside the manifest.
      val conf = sqlConf(
        ConfPrefix + "orphanGraceSeconds" -> "10",
        ConfPrefix + "localRecovery" -> "false",
        ConfPrefix + "inlineThresholdBytes" -> "0")
      val slow = provider(dir, conf = conf)
      val pool = Executors.newSingleThreadExecutor()
      val inFlight = pool.submit(new Callable[Long] {
        override def call(): Long = commitVersion(slow, 0, Map("slow" -> 1, "also" -> 2))
      })
      // The stall rule fires once per worker: wait until the slow commit holds it (the worker logs the
      // injection) before the competing commit can reach the same point. Timing from here errs late.
      val dirName = new File(new java.net.URI(dir).getPath).getName // unique: slow-commit<random>
      def stalling(line: String): Boolean = line.contains("commit:uploaded for store") && line.contains(dirName)
      def stallLogged: Boolean = StateWorker.workerFor(0).exists { w =>
        w.logFile.exists() && Files.readAllLines(w.logFile.toPath).asScala.exists(stalling)
      }
      check(awaitCondition(stallLogged, inFlight.isDone),
        s"the slow commit did not reach its stall within 60 s (done: ${inFlight.isDone})")
      val stallStarted = System.nanoTime()
      val gc = provider(dir, conf = conf)
      commitVersion(gc, 0, Map("competing" -> 9)) // another attempt at version 1: it may now delete
      // What matters is GC running once the slow attempt's files are older than the grace (10 s),
      // however long a maintenance run takes on this machine.
      var runs = 0
      var runsPastGrace = 0
      while (!inFlight.isDone) {
        if (System.nanoTime() - stallStarted > TimeUnit.MILLISECONDS.toNanos(11000)) runsPastGrace += 1
        gc.doMaintenance(); runs += 1; Thread.sleep(200)
      }
      check(inFlight.get() == 1, "the slow commit")
      pool.shutdownNow()
      check(runsPastGrace > 0, s"no maintenance run started past the grace during the slow commit ($runs in all)")
      gc.doMaintenance()
      val fresh = provider(dir, conf = conf)
      // The slow attempt's manifest was written last, so it is version 1; every file it names exists.
      check(contents(fresh.getStore(1)) == Map(("slow", 0) -> 1, ("also", 0) -> 2), "version 1 after GC")
      slow.close(); gc.close(); fresh.close()
    }

    scenario("reads_survive_pruning_maintenance_and_local_copy_cleanup", EveryBackend) {
      val dir = newDir()
      val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "1", ConfPrefix + "localRecoveryVersions" -> "1",
        "spark.sql.streaming.maxBatchesToRetainInMemory" -> "1",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2")
      val p = provider(dir, conf = conf)
      val first = (1 to 500).map(i => s"k$i" -> i).toMap
      val others = viewDirsOf(1).toSet ++ (2 to 12).flatMap(v => viewDirsOf(v)) // of other scenarios
      commitVersion(p, 0, first)
      val reader = p.getReadStore(1) // a task still reading version 1 ...
      val open = reader.iterator()
      check(open.hasNext, "version 1 is empty")
      val views = viewDirsOf(1).filterNot(others)
      // ... while later versions are committed, version 1 leaves the cache, its checkpoint files are
      // collected and its local recovery copy is pruned.
      (2 to 12).foreach { v => commitVersion(p, v - 1, Map(s"n$v" -> v), Seq(s"k$v")); p.doMaintenance() }
      val storeDir = new File(new java.net.URI(dir).getPath, "0/0")
      check(!new File(storeDir, "manifests/1.json").exists(), "retention did not remove version 1")
      val rest = Iterator.continually(open).takeWhile(_.hasNext).map(_.next()).map(_.key.getUTF8String(0).toString)
      check(rest.size == 500, s"the open iterator lost rows: ${rest.size}")
      check(contents(reader) == first.map { case (k, v) => (k, 0) -> v }, "version 1 changed under its reader")
      if (backend == "rocksdb") check(views.nonEmpty && views.forall(v => viewDirsOf(1).contains(v)),
        s"the view of version 1 was removed while it was read: $views")
      reader.release()
      if (backend == "rocksdb") check(views.forall(v => !viewDirsOf(1).contains(v)), s"a released view stayed: $views")
      p.close()
      if (backend == "rocksdb") {
        val left = (1 to 12).flatMap(v => viewDirsOf(v)).filterNot(others)
        check(left.isEmpty, s"views left after the provider closed: $left")
      }
    }

    scenario("every_layout_the_worker_writes_reads_back_in_the_jvm", BothCommitModes) {
      // An L0 trigger of 2 makes RocksDB compact all the time, so versions are made of flushed,
      // compacted and reused files; each must read back exactly through Spark's rocksdbjni.
      val dir = newDir()
      val spec = PrefixKeyScanStateEncoderSpec(keySchema, 1)
      val conf =
        sqlConf(ConfPrefix + "rocksdb.l0CompactionTrigger" -> "2", "spark.sql.streaming.minBatchesToRetain" -> "50")
      val p = provider(dir, encoder = spec, conf = conf)
      val rnd = new scala.util.Random(11)
      var model = Map.empty[(String, Int), Int]
      val versions = mutable.Map(0L -> model)
      for (v <- 1 to 25) {
        val s = p.getStore(v - 1)
        (1 to 120).foreach { _ =>
          val k = (s"g${rnd.nextInt(30)}", rnd.nextInt(20))
          if (rnd.nextInt(5) == 0) { s.remove(key(k._1, k._2)); model -= k }
          else { val x = rnd.nextInt(1000); s.put(key(k._1, k._2), value(x)); model += k -> x }
        }
        check(s.commit() == v, s"commit $v")
        check(s.metrics.numKeys == model.size, s"version $v counts ${s.metrics.numKeys} keys, expected ${model.size}")
        versions(v) = model
      }
      p.close()
      val fresh = provider(dir, encoder = spec, conf = conf)
      for (v <- 1L to 25L) {
        val store = fresh.getReadStore(v)
        check(contents(store) == versions(v), s"version $v reads back differently")
        val scanned = store.prefixScan(prefix("g3")).map(pr => (pr.key.getInt(1), pr.value.getInt(0))).toMap
        val expected = versions(v).collect { case (("g3", i), x) => i -> x }
        check(scanned == expected, s"prefix scan of version $v: $scanned != $expected")
        store.release()
      }
      fresh.close()
    }
  }
}
