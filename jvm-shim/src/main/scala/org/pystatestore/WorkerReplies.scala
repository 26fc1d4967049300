package org.pystatestore

import org.json4s._

import org.apache.spark.sql.catalyst.expressions.UnsafeRow

/** Reading what the worker hands back: fields of its JSON replies, rows of its Arrow frames. */
private[pystatestore] object WorkerReplies {
  private[pystatestore] def toRow(bytes: Array[Byte], numFields: Int): UnsafeRow = {
    val row = new UnsafeRow(numFields)
    row.pointTo(bytes, bytes.length)
    row
  }

  private[pystatestore] def stringField(json: JValue, name: String): String = json \ name match {
    case JString(s) => s
    case _ => ""
  }

  /** A version the reply names, if it names one. */
  private[pystatestore] def versionField(json: JValue, name: String): Option[Long] =
    Some(longField(json, name)).filter(_ > 0)

  private[pystatestore] def longField(json: JValue, name: String): Long = json \ name match {
    case JInt(v) => v.toLong
    case JLong(v) => v
    case JDouble(v) => v.toLong
    case _ => 0L
  }
}
