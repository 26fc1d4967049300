package org.apache.spark.sql.execution.streaming.state.pystatestore

import java.util.UUID

import org.apache.hadoop.conf.Configuration

import scala.jdk.CollectionConverters._

import org.apache.spark.{SparkException, SparkThrowable}
import org.apache.spark.sql.errors.QueryExecutionErrors
import org.apache.spark.sql.catalyst.expressions.UnsafeRow
import org.apache.spark.sql.execution.streaming.state.{RecordType, StateStoreErrors, StateStoreId, StateStoreInstanceMetric, StateStoreProvider, StateStoreProviderId, StateStoreSnapshotLastUploadInstanceMetric, SupportsFineGrainedReplay}
import org.apache.spark.util.{NextIterator, SerializableConfiguration}

/**
 * Spark's state-store error constructors are package-private; this object, living in Spark's
 * package, hands them to the shim so users get the same error classes as with built-in providers.
 */
object SparkInternals {
  /** A Hadoop configuration that travels to tasks (Spark's own wrapper is package-private). */
  def serializable(conf: Configuration): java.io.Serializable with (() => Configuration) = {
    val wrapped = new SerializableConfiguration(conf)
    new java.io.Serializable with (() => Configuration) { def apply(): Configuration = wrapped.value }
  }

  /**
   * Spark's error for a store that could not load, its message ending with the cause's: PySpark
   * shows a query's error without the Java cause chain, so the reason and the fix must be in the
   * text Spark's error carries. Spark's own CANNOT_LOAD_STATE_STORE errors pass unchanged.
   */
  def cannotLoadStore(e: Throwable): Throwable = e match {
    case s: SparkThrowable if Option(s.getCondition).exists(_.startsWith("CANNOT_LOAD_STATE_STORE")) => e
    case _ => withCauseText(StateStoreErrors.cannotLoadStore(e), e)
  }

  def unexpectedStateStoreVersion(version: Long): Throwable =
    QueryExecutionErrors.unexpectedStateStoreVersion(version)

  /** Spark's error for a commit that failed, its message ending with the cause's (as cannotLoadStore). */
  def failedToCommitStateFileError(store: String, e: Throwable): Throwable =
    withCauseText(QueryExecutionErrors.failedToCommitStateFileError(store, e), e)

  /**
   * The same error class, parameters and cause as Spark's `error`, with `cause`'s text after
   * Spark's own sentence (before its SQLSTATE): what a user reads first says what went wrong.
   */
  private def withCauseText(error: Throwable, cause: Throwable): Throwable = error match {
    case spark: SparkException if spark.getCondition != null =>
      val text = causeText(cause)
      val message = spark.getMessage
      val at = message.lastIndexOf(" SQLSTATE: ")
      val withText = if (at >= 0) s"${message.substring(0, at)} $text${message.substring(at)}"
        else s"$message $text"
      new SparkException(withText, cause, Some(spark.getCondition), spark.getMessageParameters.asScala.toMap,
        spark.getQueryContext)
    case other => other
  }

  /** pystatestore's errors say what to do in their message; anything else is named by its class. */
  private def causeText(cause: Throwable): String = {
    val ours = Iterator.iterate(cause)(_.getCause).takeWhile(_ != null).take(8)
      .find(t => t.getClass.getName.startsWith("org.pystatestore.") ||
        Option(t.getMessage).exists(_.startsWith("pystatestore")))
    ours.map(t => Option(t.getMessage).getOrElse(t.toString)).getOrElse(cause.toString)
  }

  def multipleColumnFamiliesNotSupported(provider: String): Throwable =
    StateStoreErrors.multipleColumnFamiliesNotSupported(provider)

  def removingColumnFamiliesNotSupported(provider: String): Throwable =
    StateStoreErrors.removingColumnFamiliesNotSupported(provider)

  def cannotCreateColumnFamilyWithReservedChars(family: String): Throwable =
    StateStoreErrors.cannotCreateColumnFamilyWithReservedChars(family)

  def missingColumnFamily(operation: String, family: String): Throwable =
    StateStoreErrors.unsupportedOperationOnMissingColumnFamily(operation, family)

  def unsupportedOperation(operation: String, entity: String): Throwable =
    StateStoreErrors.unsupportedOperationException(operation, entity)

  /**
   * The provider id Spark's state store coordinator tracks the store under (the store and the
   * query's run id), or None for a provider opened outside a running query (the state reader).
   */
  def providerId(storeId: StateStoreId, hadoopConf: Configuration): Option[StateStoreProviderId] = {
    // getRunId asserts that the run id is set: only a running query's tasks set it.
    val runId = try Option(StateStoreProvider.getRunId(hadoopConf)) catch { case _: AssertionError => None }
    runId.filter(_.nonEmpty).map(id => StateStoreProviderId(storeId, UUID.fromString(id)))
  }

  /**
   * Tells Spark's state store coordinator that `version` of the store is now a snapshot, as Spark's
   * own providers do after each snapshot upload: from 4.2 a store that never reports is judged
   * lagging and Spark forces a snapshot on each of its commits. False when there is no coordinator.
   */
  def reportSnapshotUploaded(id: StateStoreProviderId, version: Long, timestampMs: Long): Boolean =
    StateStoreProvider.coordinatorRef.exists(_.snapshotUploaded(id, version, timestampMs))

  /** Spark's per-store instance metric of the newest snapshot version (shown as SnapshotLastUploaded). */
  val snapshotLastUploaded: StateStoreInstanceMetric = StateStoreSnapshotLastUploadInstanceMetric()
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
