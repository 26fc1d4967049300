package org.apache.spark.sql.execution.streaming.state.pystatestore

import org.apache.spark.sql.errors.QueryExecutionErrors
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{RecordType, StateStoreErrors, SupportsFineGrainedReplay}
import org.apache.spark.util.NextIterator

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

/**
 * Spark's change-feed interface names types (NextIterator, RecordType) that are package-private to
 * Spark; this trait, in Spark's package, implements it over `changeRows`, which the provider gives
 * in plain Scala types: (is a put, key, value or null, batch id), plus what closes the source.
 */
trait ChangeFeedSupport extends SupportsFineGrainedReplay {
  protected def changeRows(
      startVersion: Long,
      endVersion: Long,
      colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String]): (Iterator[(Boolean, UnsafeRow, UnsafeRow, Long)], () => Unit)

  override def getStateStoreChangeDataReader(
      startVersion: Long,
      endVersion: Long,
      colFamilyNameOpt: Option[String],
      endVersionStateStoreCkptId: Option[String])
      : NextIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] = {
    val (rows, onClose) = changeRows(startVersion, endVersion, colFamilyNameOpt, endVersionStateStoreCkptId)
    new NextIterator[(RecordType.Value, UnsafeRow, UnsafeRow, Long)] {
      override protected def getNext(): (RecordType.Value, UnsafeRow, UnsafeRow, Long) = {
        if (rows.hasNext) {
          val (isPut, key, value, batchId) = rows.next()
          (if (isPut) RecordType.PUT_RECORD else RecordType.DELETE_RECORD, key, value, batchId)
        } else {
          finished = true
          null
        }
      }
      override protected def close(): Unit = onClose()
    }
  }
}
