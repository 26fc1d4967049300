package org.pystatestore

import org.json4s._
import org.json4s.jackson.JsonMethods
import org.json4s.jackson.JsonMethods.{compact, render}

/**
 * A store's session with the worker of its partition's slot: the store is opened there once per
 * worker generation, under a handle every call names. After a call timed out (stuck in the worker,
 * which still serves others), the store is opened afresh under a new handle, so the next task does
 * not queue behind the stuck call; the worker closes the old one once that call returns.
 *
 * `describe` gives what the worker needs to open the store (each time with a new provider-instance
 * id); `checkReadPath` refuses a worker that reads the store another way than this JVM does.
 */
private[pystatestore] final class StoreSession(
    launchSpec: WorkerLaunchSpec,
    partitionId: Int,
    describeStore: String,
    describe: () => String,
    checkReadPath: String => Unit) {
  import WorkerReplies._

  private var storeDescription = describe()
  /** Worker generation in which the store was last opened. */
  private var openedInGeneration = -1
  private var handle: String = _
  /** Set when a call timed out: the next call opens the store afresh under a new handle. */
  private var abandonedHandle: Option[String] = None

  /** The worker of the store's slot, started if there is none or it died. */
  def worker(): RunningWorker = StateWorker.acquire(launchSpec, partitionId)

  def call(what: String)(f: (PythonStateService, String) => String): JValue = call(worker(), what)(f)

  /** Opens the store in this worker generation if needed (see the class), then makes the call. */
  def call(worker: RunningWorker, what: String)(f: (PythonStateService, String) => String): JValue = {
    val h = synchronized {
      if (openedInGeneration != worker.generation || abandonedHandle.isDefined) {
        // The local database goes in the directory of the worker that serves this partition.
        val local = JObject("localDir" -> JString(worker.localStateDir.getAbsolutePath))
        val replaces = abandonedHandle match {
          case Some(old) if openedInGeneration == worker.generation =>
            storeDescription = describe()
            JObject("replacesHandle" -> JString(old))
          case _ => JObject()
        }
        val desc = compact(render(JsonMethods.parse(storeDescription).merge(local).merge(replaces)))
        val reply = StateWorker.call(worker, s"open of $describeStore", launchSpec)(_.openStore(desc))
        checkReadPath(stringField(reply, "readPath"))
        handle = (reply \ "handle").asInstanceOf[JString].s
        openedInGeneration = worker.generation
        abandonedHandle = None
      }
      handle
    }
    try StateWorker.call(worker, what, launchSpec)(svc => f(svc, h))
    catch {
      case e: StateWorkerTimeoutException =>
        synchronized { if (handle == h) abandonedHandle = Some(h) }
        throw e
    }
  }

  /**
   * Closes the store in its worker, if the worker it was opened in still serves: the worker closes
   * it once the work a durable-first commit left is done.
   */
  def close(): Unit =
    StateWorker.workerFor(partitionId).filter(w => w.isUsable && w.generation == openedInGeneration)
      .foreach(w => StateWorker.call(w, s"close of $describeStore", launchSpec)(_.closeStore(handle)))
}
