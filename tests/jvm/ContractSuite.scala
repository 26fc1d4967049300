package org.pystatestore.tests

import java.io.File
import java.nio.file.Files

import scala.util.control.NonFatal

import org.apache.spark.sql.SparkSession

import org.pystatestore.StateWorker

/**
 * The provider contract, driven directly in a JVM (DESIGN §7), after Spark's StateStoreSuiteBase
 * scenarios (ContractStoreScenarios, ContractVersionScenarios, ContractFamilyScenarios,
 * ContractWorkerScenarios, then tests/jvm/spark-MINOR/ for what only this Spark minor's API has). Run
 * by tests/test_contract.py through spark-submit. Arguments: work dir, python executable, python
 * path, the backends to run (comma-separated: "rocksdb,rocksdb:snapshot,memory"), then the names of
 * the scenarios to run (all if none). Each backend runs the scenarios whose Reach names it, with
 * workers of its own; one line per scenario: "PASS backend name 123ms" or "FAIL backend name 123ms:
 * reason", with the time the scenario took.
 */
object ContractSuite {
  import ContractHarness._

  def main(args: Array[String]): Unit = {
    configure(new File(args(0)).toPath, args(1), args(2))
    val backends = args(3).split(",").toSeq
    val only = args.drop(4).toSet
    ContractStoreScenarios.register()
    ContractVersionScenarios.register()
    ContractFamilyScenarios.register()
    ContractWorkerScenarios.register()
    MinorScenarios.register() // tests/jvm/spark-*/: what only this Spark minor's API has
    Files.createDirectories(workDir)
    val spark = SparkSession.builder().master("local[2]").appName("pystatestore-contract")
      .config("spark.ui.enabled", "false").getOrCreate()
    var failures = 0
    try {
      for (backendSpec <- backends) {
        useBackend(backendSpec)
        // A backend's scenarios start without workers, as in a JVM of their own: faults injected
        // once per worker fire again, and no worker outlives the backend it served.
        StateWorker.currentWorkers.foreach(_.process.destroyForcibly().waitFor())
        for (sc <- registered if sc.reach.runsOn(backendSpec) && (only.isEmpty || only(sc.name))) {
          val started = System.nanoTime()
          def elapsed: String = s"${(System.nanoTime() - started) / 1000000}ms"
          try {
            sc.run()
            println(s"PASS $backendSpec ${sc.name} $elapsed")
          } catch {
            case NonFatal(e) =>
              failures += 1
              val detail = e match {
                case c: Check => c.getMessage
                case other => s"${other.getClass.getName}: ${messages(other)}"
              }
              println(s"FAIL $backendSpec ${sc.name} $elapsed: ${detail.replace('\n', ' ')}")
          }
          Console.out.flush()
        }
      }
    } finally spark.stop()
    println(s"CONTRACT DONE failures=$failures")
    sys.exit(if (failures == 0) 0 else 1)
  }
}
