package org.pystatestore.tests

import java.io.File

import org.apache.spark.sql.execution.streaming.state.NoPrefixKeyStateEncoderSpec

/**
 * Spark 4.3: the additions since 4.2, plus split maintenance. Spark 4.3's maintenance threads call
 * only doSnapshotMaintenance and doCleanupMaintenance, under maintenanceLock's read lock.
 */
object MinorScenarios {
  import ContractHarness._

  def register(): Unit = {
    Since42Scenarios.register()

    scenario("split_maintenance_snapshots_and_cleans_up_separately", EveryBackend) {
      val dir = newDir()
      val conf = retainTwoConf()
      val p = provider(dir, conf = conf)
      def manifests = manifestsIn(dir)
      // As Spark 4.3's snapshot thread runs between batches: a snapshot every 2 versions, no GC.
      // (A commit that makes a snapshot due also asks for it at once, in the background: the
      // snapshot maintenance call skips a snapshot already being made, so the last may come later.)
      (1 to 6).foreach { v => commitVersion(p, v - 1, Map(s"k$v" -> v)); p.doSnapshotMaintenance() }
      check(manifests.size == 6, s"snapshot maintenance deleted versions: $manifests")
      if (changelogCommits) {
        def snapshots = Since42Scenarios.snapshotFiles(dir).map(_.takeWhile(_ != '-'))
        val deadline = System.currentTimeMillis() + 20000
        while (snapshots != Seq("2", "4", "6") && System.currentTimeMillis() < deadline) Thread.sleep(50)
        check(snapshots == Seq("2", "4", "6"), s"snapshot maintenance made snapshots of: $snapshots")
      }
      p.doCleanupMaintenance()
      // Versions 4-6 are retained. With changelog commits, while snapshot 4 is younger than the grace
      // the chain back to snapshot 2 stays too (maintenance_applies_min_batches_to_retain waits the
      // grace out; this scenario need not, it may only have passed on a slow machine).
      val retained = Seq("4.json", "5.json", "6.json")
      val kept = if (changelogCommits) Set(Seq("2.json", "3.json") ++ retained, retained) else Set(retained)
      check(kept(manifests), s"cleanup maintenance applies retention: $manifests")
      check(contents(provider(dir, conf = conf).getStore(6)).size == 6, "version 6 reloads")
      p.close()
    }

    scenario("an_unloaded_provider_skips_periodic_maintenance", DefaultBackendOnly) {
      val dir = newDir()
      // Every commit is due a snapshot (the changes since the last exceed changelogMaxBytes): while
      // loaded, the shim makes them at once; once unloaded, neither the commit's request nor Spark's
      // maintenance threads may make one or delete anything.
      val conf = sqlConf("spark.sql.streaming.minBatchesToRetain" -> "1",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "100",
        "spark.sql.streaming.stateStore.pystatestore.changelogMaxBytes" -> "1")
      val p = provider(dir, conf = conf)
      (1 to 3).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v)))
      def snapshotsOf(version: Int) = Since42Scenarios.snapshotFiles(dir).filter(_.startsWith(s"$version-"))
      // Loaded: version 3's snapshot, made by its request or here (a run skips while another snapshots).
      val deadline = System.nanoTime() + 30L * 1000 * 1000 * 1000
      while (snapshotsOf(3).isEmpty && System.nanoTime() < deadline) {
        p.doSnapshotMaintenance()
        Thread.sleep(100)
      }
      check(snapshotsOf(3).nonEmpty, s"a loaded provider made no snapshot: ${Since42Scenarios.snapshotFiles(dir)}")
      Thread.sleep(500) // requests still queued from versions 1-3 find nothing due and end
      p.setUnloaded()
      check(p.unloaded, "setUnloaded")
      commitVersion(p, 3, Map("k4" -> 4)) // a task finishing as the provider is unloaded: due a snapshot
      p.doSnapshotMaintenance()
      p.doCleanupMaintenance()
      Thread.sleep(1000) // time for a snapshot the commit requested, were it made
      val left = new File(new java.net.URI(dir).getPath, "0/0/manifests").list().length
      check(left == 4, s"an unloaded provider's maintenance deleted versions: $left manifests left")
      check(snapshotsOf(4).isEmpty, s"an unloaded provider made a snapshot: ${snapshotsOf(4)}")
      p.close()
    }

    scenario("register_col_family_accepts_the_default_family_only", DefaultBackendOnly) {
      val p = provider(newDir())
      val s = p.getStore(0)
      val spec = NoPrefixKeyStateEncoderSpec(keySchema)
      s.registerColFamily("default", keySchema, valueSchema, spec, false, false)
      val e = expectThrows[Throwable]("registerColFamily(other)")(
        s.registerColFamily("other", keySchema, valueSchema, spec, false, false))
      check(messages(e).toLowerCase.contains("column famil"), s"registerColFamily error: ${messages(e)}")
      s.abort()
      p.close()
    }
  }
}
