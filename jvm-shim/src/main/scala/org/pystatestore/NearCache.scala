package org.pystatestore

import scala.collection.immutable.{HashMap, HashSet}
import scala.jdk.CollectionConverters._

import org.apache.spark.sql.catalyst.expressions.{BoundReference, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.types.StructType

/**
 * Builds the prefix-key projection for stores opened with a prefix-scan key encoder. Projections
 * are not thread-safe, so each user takes its own from `newProjection`.
 */
final class PrefixKeySpec(keySchema: StructType, val numColsPrefixKey: Int) extends Serializable {
  def newProjection(): UnsafeProjection = UnsafeProjection.create(
    keySchema.fields.take(numColsPrefixKey).zipWithIndex.map { case (f, i) =>
      BoundReference(i, f.dataType, f.nullable)
    }.toSeq)
}

/**
 * One committed version of a store held on the JVM heap (the memory backend's near-cache, and the
 * empty version 0 of every store): a persistent (structurally shared) hash map, so a new version
 * costs O(changes) and older versions stay valid for readers and retries without copying.
 * `prefixIndex` exists only for prefix-scan stores.
 */
final class VersionState(
    val version: Long,
    val map: HashMap[UnsafeRow, UnsafeRow],
    val prefixIndex: HashMap[UnsafeRow, HashSet[UnsafeRow]],
    val dataBytes: Long,
    val manifestId: String = "") extends CommittedVersion {

  def numKeys: Long = map.size.toLong

  /** Rough JVM footprint: row bytes plus per-entry object and trie overhead. */
  def memoryBytes: Long = dataBytes + numKeys * VersionState.PerEntryOverhead

  def get(key: UnsafeRow): UnsafeRow = map.getOrElse(key, null)

  override def contains(key: UnsafeRow): Boolean = map.contains(key)

  override def pairs(): PairIterator = PairIterator.of(map.iterator)

  override def withPrefix(prefix: UnsafeRow): PairIterator =
    PairIterator.of(keysWithPrefix(prefix).iterator.map(k => (k, map(k))))

  def keysWithPrefix(prefix: UnsafeRow): HashSet[UnsafeRow] =
    if (prefixIndex == null) HashSet.empty else prefixIndex.getOrElse(prefix, HashSet.empty)

  /** The next version: this one with `puts` applied and `deletes` removed. */
  def applyChanges(
      newVersion: Long,
      newManifestId: String,
      puts: Iterable[(UnsafeRow, UnsafeRow)],
      deletes: Iterable[UnsafeRow],
      prefixOf: UnsafeRow => UnsafeRow): VersionState = {
    var m = map
    var idx = prefixIndex
    var bytes = dataBytes
    deletes.foreach { k =>
      m.get(k).foreach { old =>
        bytes -= k.getSizeInBytes + old.getSizeInBytes
        m = m.removed(k)
        if (idx != null) idx = VersionState.unindex(idx, prefixOf(k), k)
      }
    }
    puts.foreach { case (k, v) =>
      m.get(k) match {
        case Some(old) => bytes += v.getSizeInBytes - old.getSizeInBytes
        case None =>
          bytes += k.getSizeInBytes + v.getSizeInBytes
          if (idx != null) idx = VersionState.index(idx, prefixOf(k), k)
      }
      m = m.updated(k, v)
    }
    new VersionState(newVersion, m, idx, bytes, newManifestId)
  }
}

object VersionState {
  val PerEntryOverhead = 112L

  def empty(version: Long, prefixed: Boolean): VersionState =
    new VersionState(version, HashMap.empty, if (prefixed) HashMap.empty else null, 0L)

  private def index(idx: HashMap[UnsafeRow, HashSet[UnsafeRow]], p: UnsafeRow, k: UnsafeRow) =
    idx.updated(p, idx.getOrElse(p, HashSet.empty[UnsafeRow]) + k)

  private def unindex(idx: HashMap[UnsafeRow, HashSet[UnsafeRow]], p: UnsafeRow, k: UnsafeRow) = {
    val rest = idx.getOrElse(p, HashSet.empty[UnsafeRow]) - k
    if (rest.isEmpty) idx.removed(p) else idx.updated(p, rest)
  }

  /** Builds a version from loaded pairs (already copied, owned rows). */
  def build(
      version: Long,
      manifestId: String,
      pairs: Iterator[(UnsafeRow, UnsafeRow)],
      prefixOf: Option[UnsafeRow => UnsafeRow]): VersionState = {
    val mb = HashMap.newBuilder[UnsafeRow, UnsafeRow]
    var bytes = 0L
    val byPrefix = new java.util.HashMap[UnsafeRow, HashSet[UnsafeRow]]()
    pairs.foreach { case (k, v) =>
      mb += k -> v
      bytes += k.getSizeInBytes + v.getSizeInBytes
      prefixOf.foreach { f =>
        val p = f(k)
        byPrefix.put(p, byPrefix.getOrDefault(p, HashSet.empty) + k)
      }
    }
    val idx = prefixOf.map(_ => HashMap.from(byPrefix.asScala)).orNull
    new VersionState(version, mb.result(), idx, bytes, manifestId)
  }
}
