package org.apache.spark.sql.execution.streaming.state.pystatestore

import org.apache.spark.sql.errors.QueryExecutionErrors
import org.apache.spark.sql.execution.streaming.state.StateStoreErrors

/**
 * Spark's state-store error constructors are package-private; this object, living in Spark's
 * package, hands them to the shim so users get the same error classes as with built-in providers.
 */
object SparkInternals {
  def cannotLoadStore(e: Throwable): Throwable = StateStoreErrors.cannotLoadStore(e)

  def unexpectedStateStoreVersion(version: Long): Throwable =
    QueryExecutionErrors.unexpectedStateStoreVersion(version)

  def failedToCommitStateFileError(store: String, e: Throwable): Throwable =
    QueryExecutionErrors.failedToCommitStateFileError(store, e)

  def checkpointIdsNotSupported(msg: String): Throwable =
    StateStoreErrors.stateStoreCheckpointIdsNotSupported(msg)

  def multipleColumnFamiliesNotSupported(provider: String): Throwable =
    StateStoreErrors.multipleColumnFamiliesNotSupported(provider)

  def removingColumnFamiliesNotSupported(provider: String): Throwable =
    StateStoreErrors.removingColumnFamiliesNotSupported(provider)

  def unsupportedOperation(operation: String, entity: String): Throwable =
    StateStoreErrors.unsupportedOperationException(operation, entity)
}
