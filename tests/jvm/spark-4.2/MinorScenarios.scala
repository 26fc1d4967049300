package org.pystatestore.tests

/** Spark 4.2: the additions since 4.2 (its maintenance is still the single doMaintenance). */
object MinorScenarios {
  def register(): Unit = Since42Scenarios.register()
}
