package org.pystatestore.tests

import java.io.File

import org.apache.spark.SparkThrowable
import org.apache.spark.sql.execution.streaming.state.StateStoreProvider

/**
 * What Spark 4.2 added to the provider contract, for 4.2 and 4.3 alike: forceSnapshotOnCommit,
 * loadEmpty, multiGet, range scans and multiple values per key.
 */
object Since42Scenarios {
  import ContractHarness._

  def snapshotFiles(dir: String): Seq[String] =
    Option(new File(new java.net.URI(dir).getPath, "0/0/snapshots").list()).map(_.toSeq.sorted).getOrElse(Nil)

  /** The store's directory as errors print it (a URI's path: "file:///x" prints as "file:/x"). */
  def storePath(p: StateStoreProvider): String =
    new java.net.URI(p.stateStoreId.checkpointRootLocation).getPath.stripSuffix("/")

  def register(): Unit = {
    scenario("force_snapshot_on_commit_has_a_snapshot_when_commit_returns", DefaultBackendOnly) {
      val dir = newDir()
      // Maintenance would snapshot only after 100 versions: any snapshot is the commit's own.
      val p = provider(dir, conf = sqlConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "100"))
      (1 to 3).foreach(v => commitVersion(p, v - 1, Map(s"k$v" -> v)))
      check(snapshotFiles(dir).isEmpty, s"no snapshot before forcing: ${snapshotFiles(dir)}")
      val s = p.getStore(3, None, forceSnapshotOnCommit = true, loadEmpty = false)
      s.put(key("k4"), value(4))
      s.commit()
      check(snapshotFiles(dir).exists(_.startsWith("4-")), s"version 4's snapshot: ${snapshotFiles(dir)}")
      // Upgrading a read store keeps the flag too.
      val up = p.upgradeReadStoreToWriteStore(p.getReadStore(4), 4, None, forceSnapshotOnCommit = true)
      up.put(key("k5"), value(5))
      up.commit()
      check(snapshotFiles(dir).exists(_.startsWith("5-")), s"version 5's snapshot: ${snapshotFiles(dir)}")
      val fresh = provider(dir)
      check(contents(fresh.getStore(5)).size == 5, "version 5 reloads")
      fresh.close(); p.close()
    }

    scenario("load_empty_writes_a_version_that_needs_no_earlier_one", EveryBackend) {
      val dir = newDir()
      val p = provider(dir)
      val s = p.getStore(7, None, forceSnapshotOnCommit = false, loadEmpty = true)
      check(contents(s).isEmpty, s"an empty store at version 7 reads empty: ${contents(s)}")
      s.put(key("a"), value(1))
      s.put(key("b"), value(2))
      check(s.commit() == 8, "the commit on an empty version 7 is version 8")
      commitVersion(p, 8, Map("c" -> 3))
      val fresh = provider(dir)
      check(contents(fresh.getStore(8)) == Map(("a", 0) -> 1, ("b", 0) -> 2), s"version 8 alone: ${contents(fresh.getStore(8))}")
      check(contents(fresh.getStore(9)) == Map(("a", 0) -> 1, ("b", 0) -> 2, ("c", 0) -> 3), "version 9 on it")
      fresh.close(); p.close()
    }

    scenario("multi_get_sees_the_buffer_and_the_base", DefaultBackendOnly) {
      val p = provider(newDir())
      commitVersion(p, 0, Map("a" -> 1, "b" -> 2))
      val s = p.getStore(1)
      s.put(key("c"), value(3))
      s.remove(key("a"))
      val got = s.multiGet(Array(key("a"), key("b"), key("c"), key("zz")), "default").map(intOf).toList
      check(got == List(None, Some(2), Some(3), None), s"multiGet on the write store: $got")
      s.abort()
      val r = p.getReadStore(1)
      val read = r.multiGet(Array(key("a"), key("b")), "default").map(intOf).toList
      check(read == List(Some(1), Some(2)), s"multiGet on the read store: $read")
      r.abort()
      p.close()
    }

    scenario("range_scans_and_multiple_values_are_refused_with_spark_errors", DefaultBackendOnly) {
      val p = provider(newDir())
      val s = p.getStore(0)
      val calls: Seq[(String, () => Any)] = Seq(
        "rangeScan" -> (() => s.rangeScan(Some(key("a")), None, "default")),
        "rangeScanWithMultiValues" -> (() => s.rangeScanWithMultiValues(None, None, "default")),
        "deleteRange" -> (() => s.deleteRange(key("a"), key("b"), "default")),
        "prefixScanWithMultiValues" -> (() => s.prefixScanWithMultiValues(key("a"), "default")),
        "iteratorWithMultiValues" -> (() => s.iteratorWithMultiValues("default")))
      for ((name, call) <- calls) {
        val e = expectThrows[Throwable](name)(call())
        check(e.isInstanceOf[SparkThrowable], s"$name: not a Spark error: $e")
        check(messages(e).contains(storePath(p)), s"$name names no store: ${messages(e)}")
      }
      check(s.allColumnFamilyNames == Set("default"), s"column families: ${s.allColumnFamilyNames}")
      s.abort()
      p.close()
    }
  }
}
