package org.pystatestore.tests

import java.nio.file.Files
import java.util.concurrent.{Callable, ExecutionException, Executors, TimeUnit}

import org.pystatestore.{Release, StateWorker}

/**
 * The JVM's workers: death mid-call and between calls, a view that outlives its worker, an apply
 * that failed after its commit replied, the pool over partitions, bad interpreters and worker
 * counts, a frozen worker, a call stuck in one store, a transport error, a worker of another release.
 */
object ContractWorkerScenarios {
  import ContractHarness._

  def register(): Unit = {
    scenario("worker_death_fails_the_commit_and_the_next_task_recovers", DefaultBackendOnly) {
      val dir = newDir()
      val p = provider(dir)
      commitVersion(p, 0, Map("a" -> 1))
      val worker = StateWorker.workerFor(0).get
      val deadWorkersDatabases = Option(worker.localStateDir.listFiles()).toSeq.flatten.flatMap { d =>
        Option(d.listFiles()).toSeq.flatten
      }
      check(deadWorkersDatabases.nonEmpty, s"no local databases under ${worker.localStateDir}")
      val s = p.getStore(1)
      s.put(key("b"), value(2))
      // Freeze the worker so the commit is surely in flight, then kill it mid-call.
      new ProcessBuilder("kill", "-STOP", worker.pid.toString).start().waitFor()
      val pool = Executors.newSingleThreadExecutor()
      val inFlight = pool.submit(new Callable[Long] { override def call(): Long = s.commit() })
      // The commit's change frame appears just before its call is sent; the frozen worker keeps it.
      def frameWritten: Boolean = Option(worker.exchangeDir.list()).exists(_.exists(_.startsWith("commit-")))
      check(awaitCondition(frameWritten, inFlight.isDone),
        s"the commit wrote no change frame to ${worker.exchangeDir} within 60 s")
      Thread.sleep(300)
      worker.process.destroyForcibly().waitFor()
      val e = expectThrows[Throwable]("commit against a dying worker") {
        try inFlight.get(60, TimeUnit.SECONDS) catch { case ee: ExecutionException => throw ee.getCause }
      }
      pool.shutdownNow()
      val text = messages(e)
      check(text.contains("died") && text.contains(worker.logFile.getPath),
        s"error should say the worker died and where its log is: $text")
      s.abort()
      // the retried task: same version again, a fresh worker that reloads version 1 from the checkpoint
      check(commitVersion(p, 1, Map("b" -> 2)) == 2, "retry commits")
      check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
      val leftBehind = deadWorkersDatabases.filter(_.exists)
      check(leftBehind.isEmpty, s"the dead worker's local databases were left behind: ${leftBehind.take(3)}")
      val fresh = provider(dir)
      check(contents(fresh.getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "state after worker restart")
      p.close(); fresh.close()
    }

    scenario("worker_killed_between_calls_is_replaced_transparently", DefaultBackendOnly) {
      val dir = newDir()
      val p = provider(dir)
      commitVersion(p, 0, Map("a" -> 1))
      val worker = StateWorker.workerFor(0).get
      worker.process.destroyForcibly().waitFor()
      // Nothing was in flight, so nothing fails: the next call starts a worker that reloads version 1.
      check(commitVersion(p, 1, Map("b" -> 2)) == 2, "commit after the worker was killed while idle")
      check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
      check(contents(provider(dir).getStore(2)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "state after restart")
      p.close()
    }

    scenario("a_worker_killed_while_a_view_is_open", DefaultBackendOnly) {
      val dir = newDir()
      val p = provider(dir)
      commitVersion(p, 0, (1 to 200).map(i => s"k$i" -> i).toMap)
      val s = p.getStore(1)
      check(intOf(s.get(key("k7"))).contains(7), "read before the kill")
      val worker = StateWorker.workerFor(0).get
      worker.process.destroyForcibly().waitFor()
      check(intOf(s.get(key("k8"))).contains(8), "a read after the worker died")
      check(contents(s).size == 200, "iteration after the worker died")
      s.put(key("new"), value(1)); s.remove(key("k1"))
      check(s.commit() == 2, "the commit after the worker died goes to a new worker")
      check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
      val got = contents(provider(dir).getStore(2))
      check(got.size == 200 && got.get(("new", 0)).contains(1) && !got.contains(("k1", 0)),
        s"version 2: ${got.size} keys")
      p.close()
    }

    scenario("a_version_whose_apply_failed_after_its_commit_is_read_whole", DefaultBackendOnly) {
      // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) fails the worker's apply of the first
      // commit of any store whose directory contains "apply-fails", after that commit replied
      // (durable first, rocksdb changelog): its view must come from the checkpoint instead.
      val dir = Files.createTempDirectory(workDir, "apply-fails").toUri.toString
      val p = provider(dir)
      commitVersion(p, 0, Map("a" -> 1, "b" -> 2))
      val s = p.getStore(1) // from the cache: the view the failed apply never made
      check(contents(s) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"version 1 after a failed apply: ${contents(s)}")
      s.put(key("c"), value(3))
      s.remove(key("a"))
      check(s.commit() == 2, "a commit on the version whose apply failed")
      val byName = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
      check(byName("pystatestoreApplyFailures") == 1,
        s"apply failures reported: ${byName("pystatestoreApplyFailures")}")
      check(byName.contains("pystatestoreViewWaitMs"), "view wait reported")
      s.release()
      check(contents(p.getStore(2)) == Map(("b", 0) -> 2, ("c", 0) -> 3), "version 2, read from the cache")
      val fresh = provider(dir)
      check(contents(fresh.getStore(2)) == Map(("b", 0) -> 2, ("c", 0) -> 3), "version 2 from the checkpoint")
      p.close(); fresh.close()
    }

    scenario("a_bad_worker_count_is_refused_naming_the_conf", DefaultBackendOnly) {
      for (bad <- Seq("0", "many", "65")) {
        val e = expectThrows[Throwable](s"workers=$bad") {
          provider(newDir(), conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.workers" -> bad))
        }
        check(messages(e).contains(s"spark.sql.streaming.stateStore.pystatestore.workers=$bad") &&
          messages(e).contains("fix or unset it"), s"workers=$bad: ${messages(e)}")
      }
    }

    scenario("partitions_are_spread_over_the_pool_and_one_worker_dying_spares_the_others", DefaultBackendOnly) {
      val dir = newDir()
      val ps = (0 until 2).map(part => provider(dir, partition = part))
      ps.zipWithIndex.foreach { case (p, part) => commitVersion(p, 0, Map(s"p$part" -> 1)) }
      val pool = StateWorker.currentWorkers
      // local[2] on this machine: one worker per task slot, at most one per core
      val expected = math.min(2, Runtime.getRuntime.availableProcessors())
      check(pool.size == expected, s"expected $expected workers in this JVM, found ${pool.map(_.describe)}")
      if (expected == 2) {
        val Seq(w0, w1) = Seq(0, 1).map(part => StateWorker.workerFor(part).get)
        check(w0.pid != w1.pid && w0.localStateDir != w1.localStateDir, s"partitions 0 and 1 share ${w0.describe}")
        def hasLocalDb: Boolean = Option(w1.localStateDir.list()).exists(_.nonEmpty)
        check(hasLocalDb, s"no local database under ${w1.localStateDir}")
        w0.process.destroyForcibly().waitFor()
        check(commitVersion(ps(0), 1, Map("p0b" -> 2)) == 2, "partition 0 commits after its worker was killed")
        check(StateWorker.workerFor(1).get eq w1, "partition 1's worker must not be replaced for another's death")
        check(hasLocalDb, "partition 1's local database was deleted")
        check(contents(ps(1).getStore(1)) == Map(("p1", 0) -> 1), "partition 1 reads from its worker")
      }
      ps.foreach(_.close())
    }

    scenario("two_partitions_commit_concurrently", DefaultBackendOnly) {
      val dir = newDir()
      val pool = Executors.newFixedThreadPool(4)
      try {
        val futures = (0 until 4).map { part =>
          pool.submit(new Callable[Map[(String, Int), Int]] {
            override def call(): Map[(String, Int), Int] = {
              val p = provider(dir, partition = part)
              (1 to 5).foreach(v => commitVersion(p, v - 1, Map(s"p$part-$v" -> v)))
              val c = contents(p.getStore(5))
              p.close(); c
            }
          })
        }
        futures.zipWithIndex.foreach { case (f, part) =>
          val c = f.get(120, TimeUnit.SECONDS)
          check(c == (1 to 5).map(v => (s"p$part-$v", 0) -> v).toMap, s"partition $part: $c")
        }
      } finally pool.shutdownNow()
    }

    scenario("a_python_that_cannot_run_the_worker_gives_a_clear_error", DefaultBackendOnly) {
      StateWorker.currentWorkers.foreach(_.process.destroyForcibly().waitFor())
      val p = provider(newDir(), conf = sqlConf(ConfPrefix + "pythonExec" -> "/bin/false"))
      val s = p.getStore(0)
      s.put(key("a"), value(1))
      val e = expectThrows[Throwable]("commit with a broken interpreter")(s.commit())
      val text = messages(e)
      check(text.contains("/bin/false") && text.contains("exited with code 1") &&
        text.contains("spark.sql.streaming.stateStore.pystatestore.pythonExec"), s"unclear error: $text")
      s.abort(); p.close()
      // a later store with a working interpreter starts a proper worker
      val good = provider(newDir())
      check(commitVersion(good, 0, Map("a" -> 1)) == 1, "a good worker starts after a failed one")
      good.close()
    }

    scenario("a_frozen_worker_fails_the_call_within_bounds", DefaultBackendOnly) {
      val dir = newDir()
      val p = provider(dir, conf = sqlConf(ConfPrefix + "workerProbeIntervalMs" -> "1000"))
      commitVersion(p, 0, Map("a" -> 1))
      val worker = StateWorker.workerFor(0).get
      val s = p.getStore(1)
      s.put(key("b"), value(2))
      // The view of version 1 is ready (durable first): the commit is the call that meets the frozen worker.
      s.get(key("a"))
      new ProcessBuilder("kill", "-STOP", worker.pid.toString).start().waitFor()
      val started = System.nanoTime()
      val e = expectThrows[Throwable]("commit against a frozen worker")(s.commit())
      val tookMs = (System.nanoTime() - started) / 1000000
      val text = messages(e)
      check(tookMs < 15000, s"a frozen worker held the task for $tookMs ms")
      check(text.contains("stopped answering") && text.contains(s"pid ${worker.pid}") &&
        text.contains(worker.logFile.getPath) && text.contains("commit of"), s"unclear error: $text")
      s.abort()
      check(commitVersion(p, 1, Map("b" -> 2)) == 2, "the retry commits with a new worker")
      check(StateWorker.workerFor(0).get.generation > worker.generation, "a new worker was started")
      p.close()
    }

    scenario("a_call_stuck_in_one_store_times_out_alone", DefaultBackendOnly) {
      // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) stalls the first commit of any
      // store whose directory contains "stuck-store" for 8 s in the worker.
      val stuckDir = Files.createTempDirectory(workDir, "stuck-store").toUri.toString
      val conf = sqlConf(
        "spark.sql.streaming.stateStore.pystatestore.callTimeoutMs" -> "2500",
        "spark.sql.streaming.stateStore.pystatestore.workerProbeIntervalMs" -> "1000")
      val stuck = provider(stuckDir, conf = conf)
      val healthy = provider(newDir(), conf = conf)
      commitVersion(healthy, 0, Map("warm" -> 1)) // the worker is up
      val worker = StateWorker.workerFor(0).get
      val pool = Executors.newSingleThreadExecutor()
      val inFlight =
        pool.submit(new Callable[Long] { override def call(): Long = commitVersion(stuck, 0, Map("a" -> 1)) })
      Thread.sleep(300)
      check(commitVersion(healthy, 1, Map("other" -> 2)) == 2, "another store commits while one is stuck")
      val e = expectThrows[Throwable]("the stuck commit") {
        try inFlight.get(30, TimeUnit.SECONDS) catch { case ee: ExecutionException => throw ee.getCause }
      }
      pool.shutdownNow()
      val text = messages(e)
      check(text.contains("did not return within 2500 ms") && text.contains("stuck-store") &&
        text.contains(s"pid ${worker.pid}") && text.contains(worker.logFile.getPath), s"unclear timeout: $text")
      check(StateWorker.workerFor(0).get eq worker, "the worker must not be replaced for one stuck call")
      check(commitVersion(healthy, 2, Map("more" -> 3)) == 3, "the healthy store still commits")
      // The retried task opens the store afresh and does not queue behind the stuck call.
      val retryStarted = System.nanoTime()
      check(commitVersion(stuck, 0, Map("a" -> 1)) == 1, "the retry of the stuck store commits")
      check((System.nanoTime() - retryStarted) / 1000000 < 2500, "the retry waited for the stuck call")
      stuck.close(); healthy.close()
    }

    scenario("a_transport_error_fails_only_that_call", DefaultBackendOnly) {
      // PYSTATESTORE_TEST_FAULTS (set by tests/test_contract.py) closes the connection of the first
      // commit of any store whose directory contains "severed-store", as a network failure would.
      val severedDir = Files.createTempDirectory(workDir, "severed-store").toUri.toString
      val severed = provider(severedDir)
      val healthy = provider(newDir())
      commitVersion(healthy, 0, Map("warm" -> 1)) // the worker is up
      val worker = StateWorker.workerFor(0).get
      val e = expectThrows[Throwable]("the severed commit")(commitVersion(severed, 0, Map("a" -> 1)))
      val text = messages(e)
      check(text.contains("failed in transport") && text.contains("still answers") && text.contains("severed-store") &&
        text.contains(s"pid ${worker.pid}") && text.contains(worker.logFile.getPath), s"unclear transport error: $text")
      check(StateWorker.workerFor(0).get eq worker, "the worker must not be replaced for one transport error")
      check(commitVersion(healthy, 1, Map("other" -> 2)) == 2, "another store still commits")
      check(commitVersion(severed, 0, Map("a" -> 1)) == 1, "the retry of the severed store commits")
      check(contents(severed.getStore(1)) == Map(("a", 0) -> 1), "the retried version")
      severed.close(); healthy.close()
    }

    scenario("a_worker_of_another_release_is_refused", DefaultBackendOnly) {
      val foreign = sys.env.getOrElse("PYSTATESTORE_TEST_FOREIGN_PYTHONPATH", "")
      check(foreign.nonEmpty, "tests/test_contract.py must set PYSTATESTORE_TEST_FOREIGN_PYTHONPATH")
      StateWorker.currentWorkers.foreach(_.process.destroyForcibly().waitFor())
      val p = provider(newDir(), conf = sqlConf("spark.sql.streaming.stateStore.pystatestore.pythonPath" -> foreign))
      val s = p.getStore(0)
      s.put(key("a"), value(1))
      val e = expectThrows[Throwable]("commit through a worker of another release")(s.commit())
      val text = messages(e)
      check(text.contains("runs pystatestore 0.1.0 (protocol 1)") &&
        text.contains(s"this jar is pystatestore ${Release.Version} (protocol ${StateWorker.ProtocolVersion})") &&
        text.contains("pythonExec"), s"unclear refusal: $text")
      s.abort(); p.close()
      val good = provider(newDir())
      check(commitVersion(good, 0, Map("a" -> 1)) == 1, "a matching worker starts afterwards")
      good.close()
    }
  }
}
