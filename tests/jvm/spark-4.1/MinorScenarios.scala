package org.pystatestore.tests

import org.pystatestore.PythonStateStoreProvider

/** Spark 4.1's own signatures: the two-argument getStore and the three-argument upgrade. */
object MinorScenarios {
  import ContractHarness._

  def register(): Unit = {
    scenario("spark41_get_store_and_upgrade_signatures", DefaultBackendOnly) {
      val p: PythonStateStoreProvider = provider(newDir())
      val s = p.getStore(0L, None)
      s.put(key("a"), value(1))
      s.commit()
      val upgraded = p.upgradeReadStoreToWriteStore(p.getReadStore(1), 1L, None)
      upgraded.put(key("b"), value(2))
      upgraded.commit()
      check(contents(p.getStore(2L, None)) == Map(("a", 0) -> 1, ("b", 0) -> 2), "version 2 after the upgrade")
      p.close()
    }
  }
}
