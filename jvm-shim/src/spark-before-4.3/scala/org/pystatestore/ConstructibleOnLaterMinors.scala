package org.pystatestore

import java.util.concurrent.locks.ReentrantReadWriteLock

/**
 * Spark 4.3 gave StateStoreProvider fields (`unloaded`, `maintenanceLock`) whose initialisers call
 * accessors that a class compiled for 4.1 or 4.2 lacks, so on 4.3 such a class failed at
 * construction with an AbstractMethodError that names none of this. These are those accessors
 * under their JVM names, never used on the minors this jar is for: construction on 4.3 then
 * reaches the core's check, which names the jar to use.
 */
trait ConstructibleOnLaterMinors {
  def unloaded: Boolean = false
  def unloaded_=(value: Boolean): Unit = ()
  def maintenanceLock: ReentrantReadWriteLock = null
  // scalastyle:off - the name Spark 4.3's trait initialiser calls
  def org$apache$spark$sql$execution$streaming$state$StateStoreProvider$_setter_$maintenanceLock_$eq(
      lock: ReentrantReadWriteLock): Unit = ()
}
