package org.pystatestore

/**
 * The control-plane contract between the JVM shim and the Python state worker.
 *
 * The Python worker implements this interface (Py4J callback); the JVM calls it. Every call carries
 * small strings only: rows never cross Py4J (it encodes byte[] as text). Bulk data moves through
 * Arrow IPC files whose paths are passed here. Every method returns a JSON object; a failure inside
 * the worker is returned as `{"error": {"type": ..., "message": ...}}` rather than thrown, so that
 * the JVM can tell a worker-side error (reported as is) from a dead worker (reported as such).
 * The protocol is documented in docs/ARCHITECTURE.md.
 */
trait PythonStateService {

  /** Returns `{"protocol": N, "pid": P, "backends": [...]}`. */
  def hello(): String

  /**
   * Opens (or re-opens) a store from a JSON description; returns
   * `{"handle", "readPath": "view"|"frame", "keyEncoding"}`.
   */
  def openStore(storeJson: String): String

  /**
   * Makes `version` readable by the JVM. Backends read through views (rocksdb) leave a read-only
   * RocksDB checkpoint of it at `viewDir` (a new directory the JVM owns from then on); the memory
   * backend writes its key/value pairs to `outPath` as an Arrow IPC stream with schema
   * (key: binary, value: binary). `checkpointId` names the attempt to load (Spark's checkpoint
   * format v2; "" otherwise). Returns `{"manifestId", "numKeys", "numInternalKeys", "bytes", "source", "loadMs"}`.
   */
  def load(handle: String, version: Long, checkpointId: String, outPath: String, viewDir: String): String

  /**
   * Applies the changes in `changesPath` (Arrow IPC stream: op int8, key binary, value binary) to
   * `baseVersion` and makes `baseVersion + 1` durable. Returns only once the manifest is written.
   * `baseManifestId` names the attempt at the base version the changes were computed on ("" for
   * version 0); the worker refuses the commit if another attempt has since replaced it.
   * `numKeys` is the new version's key count (the JVM saw which keys existed), `numInternalKeys`
   * those of them in internal column families (timers, TTL indexes, the family registry), which
   * Spark's numKeys leaves out; both come back from loads and commits. Backends read
   * through views leave the new version's read view at `viewDir`, or, when the reply says
   * `viewPending`, make it after replying (`awaitView`). With `forceSnapshot` the call
   * returns only once the new version also has a snapshot (Spark 4.2's forceSnapshotOnCommit).
   * With `emptyBase` the changes are the whole new state: nothing of `baseVersion` is read, and the
   * new version needs no earlier one (Spark's loadEmpty).
   */
  def commit(handle: String, baseVersion: Long, baseManifestId: String, changesPath: String,
      attemptId: String, numKeys: Long, numInternalKeys: Long, viewDir: String, forceSnapshot: Boolean, emptyBase: Boolean): String

  /**
   * Returns once the read view of `version` (the attempt `manifestId`) is at `viewDir`, where a
   * commit that replied `viewPending` (durable first: the version was durable before the worker
   * brought its local database and the view up) left it to be made: at once if the worker did so,
   * else after loading the version from the checkpoint into `viewDir` (that work failed, or the
   * worker that had it died). Returns `{"viewLeftByApply", "viewWaitMs"}` and, after a load, what
   * `load` returns; refuses a version another attempt has since replaced (`VersionReplacedError`).
   */
  def awaitView(handle: String, version: Long, manifestId: String, viewDir: String): String

  /**
   * The maintenance `parts` (comma-separated): `snapshot` makes a due snapshot of a changelog
   * chain; `cleanup` applies retention and removes files no retained version needs.
   */
  def maintenance(handle: String, parts: String): String

  /**
   * Writes the changes of versions `startVersion` to `endVersion` (inclusive) to `outPath` as an
   * Arrow IPC stream (version int64, op int8, key binary, value binary; value null for deletes),
   * version by version. Returns `{"rows"}`. Spark's change feed (readChangeFeed). `endId` names
   * the attempt of `endVersion` (checkpoint format v2; "" otherwise): the versions before it are
   * the ones it was committed on.
   */
  def changes(handle: String, startVersion: Long, endVersion: Long, endId: String, outPath: String): String

  /**
   * Leaves a read view of `endVersion` at `viewDir`, rebuilt from the snapshot of
   * `snapshotVersion` and the changes after it (Spark's snapshotStartBatchId). Replies like `load`.
   * The ids name the attempts (checkpoint format v2; "" otherwise).
   */
  def replay(handle: String, snapshotVersion: Long, snapshotId: String, endVersion: Long, endId: String,
      viewDir: String): String

  /** Forgets the store's in-memory state (its files stay). */
  def closeStore(handle: String): String
}
