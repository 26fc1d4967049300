package org.pystatestore

import java.io.File
import java.util.concurrent.{CompletableFuture, ExecutionException, Executors, ThreadFactory, TimeUnit,
  TimeoutException}
import java.util.concurrent.atomic.{AtomicBoolean, AtomicInteger}

import scala.util.control.NonFatal

import org.json4s._
import org.json4s.jackson.JsonMethods
import py4j.GatewayServer

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging

/** The worker process died or could not be reached; the task should fail and be retried. */
class StateWorkerDiedException(message: String, cause: Throwable)
  extends RuntimeException(message, cause)

/** The worker answered with an error of its own (bad checkpoint, failed upload, ...). */
class StateWorkerException(val errorType: String, message: String)
  extends RuntimeException(message)

/**
 * A call did not return within its time limit although the worker still answers health checks:
 * that store's call is stuck (not the worker), so only this call fails.
 */
class StateWorkerTimeoutException(message: String) extends RuntimeException(message)

/** How to start and talk to the Python worker: resolved from provider confs, Spark conf, environment. */
case class WorkerLaunchSpec(
    pythonExec: String,
    pythonPath: Option[String],
    startTimeoutMs: Long,
    callTimeoutMs: Long = WorkerLaunchSpec.DefaultCallTimeoutMs,
    probeIntervalMs: Long = WorkerLaunchSpec.DefaultProbeIntervalMs,
    workers: Int = 1,
    pythonExecFrom: String = "the default python3")

object WorkerLaunchSpec {
  val ConfPrefix = "spark.sql.streaming.stateStore.pystatestore."
  val DefaultCallTimeoutMs: Long = 30L * 60 * 1000
  val DefaultProbeIntervalMs: Long = 30L * 1000
  /** A worker costs about 80 MiB at rest (bench/README.md, the scale bench); past this, extra task slots share workers. */
  val MaxDefaultWorkers = 4

  /** Interpreter: provider conf, else spark.pyspark.python, else PYSPARK_PYTHON, else python3. */
  def resolve(providerConfs: Map[String, String]): WorkerLaunchSpec = {
    val sparkConf = Option(SparkEnv.get).map(_.conf)
    val (exec, from) = providerConfs.get(ConfPrefix + "pythonExec").map(_ -> (ConfPrefix + "pythonExec"))
      .orElse(sparkConf.flatMap(_.getOption("spark.pyspark.python")).map(_ -> "spark.pyspark.python"))
      .orElse(sys.env.get("PYSPARK_PYTHON").map(_ -> "the environment variable PYSPARK_PYTHON"))
      .getOrElse("python3" -> "the default python3 (no conf set it)")
    WorkerLaunchSpec(
      exec,
      providerConfs.get(ConfPrefix + "pythonPath").filter(_.nonEmpty),
      positiveMs(providerConfs, "workerStartTimeoutMs", 60000L),
      positiveMs(providerConfs, "callTimeoutMs", DefaultCallTimeoutMs),
      positiveMs(providerConfs, "workerProbeIntervalMs", DefaultProbeIntervalMs),
      workerCount(providerConfs),
      from)
  }

  /**
   * Workers per JVM: the conf, else one per task slot (at most the cores, at most
   * MaxDefaultWorkers). rocksdict holds the GIL through its fsyncs, so two tasks committing in one
   * worker wait for each other; in two workers they commit side by side.
   */
  private def workerCount(confs: Map[String, String]): Int = confs.get(ConfPrefix + "workers") match {
    case Some(v) => scala.util.Try(v.trim.toInt).toOption.filter(n => n >= 1 && n <= 64).getOrElse {
      throw new IllegalArgumentException(
        s"${ConfPrefix}workers=$v is not a number of Python workers per JVM from 1 to 64; fix or unset it")
    }
    case None =>
      val cores = Runtime.getRuntime.availableProcessors()
      math.max(1, Seq(taskSlots.getOrElse(cores), cores, MaxDefaultWorkers).min)
  }

  /** Tasks this JVM runs at once, where Spark's conf says: local[N] on the driver, executor cores. */
  private def taskSlots: Option[Int] = Option(SparkEnv.get).flatMap { env =>
    val conf = env.conf
    val cpusPerTask = math.max(1, conf.getInt("spark.task.cpus", 1))
    val cores = if (env.executorId == "driver") {
      conf.getOption("spark.master").flatMap(localThreads)
    } else conf.getOption("spark.executor.cores").flatMap(c => scala.util.Try(c.trim.toInt).toOption)
    cores.map(c => math.max(1, c / cpusPerTask))
  }

  private val LocalMaster = "^local(?:\\[(\\d+|\\*)(?:,\\s*\\d+)?\\])?$".r

  private def localThreads(master: String): Option[Int] = master.trim match {
    case LocalMaster(null) => Some(1)
    case LocalMaster("*") => Some(Runtime.getRuntime.availableProcessors())
    case LocalMaster(n) => Some(n.toInt)
    case _ => None // a cluster master: the driver runs no tasks
  }

  private def positiveMs(confs: Map[String, String], name: String, default: Long): Long =
    confs.get(ConfPrefix + name) match {
      case None => default
      case Some(v) => scala.util.Try(v.trim.toLong).toOption.filter(_ > 0).getOrElse {
        throw new IllegalArgumentException(
          s"$ConfPrefix$name=$v is not a positive number of milliseconds; fix or unset it")
      }
    }
}

/**
 * One running Python worker: its process, the Py4J gateway it talks to, and the service proxy it
 * registered. Instances are replaced, never revived: once dead, `StateWorker.acquire` starts anew.
 */
final class RunningWorker private[pystatestore] (
    val generation: Int,
    val slot: Int,
    val process: Process,
    val logFile: File,
    val exchangeDir: File,
    gateway: GatewayServer,
    val service: PythonStateService) {

  @volatile private var markedDead = false
  @volatile private[pystatestore] var diedAbnormally = false
  /** The worker's resident memory last seen by the sampler (0: never) and its peak so far, for its
   * obituary should it be killed. */
  @volatile private[pystatestore] var lastRssBytes = 0L
  @volatile private[pystatestore] var peakRssBytes = 0L
  /** Where the kernel counts its OOM kills, and the count when it started: a rise means one of ours. */
  private[pystatestore] val memoryCgroup = WorkerDiagnosis.memoryCgroup(process.pid())
  private[pystatestore] val oomKillsAtStart = memoryCgroup.flatMap(_.oomKills)

  def pid: Long = process.pid()

  /** Where the worker reaches this JVM (loopback only); exposed for diagnostics and tests. */
  def gatewayPort: Int = gateway.getListeningPort

  def gatewayAddress: String = gateway.getAddress.getHostAddress

  def isUsable: Boolean = !markedDead && process.isAlive

  def describe: String = s"pystatestore state worker (pid $pid, slot $slot, generation $generation)"

  /** Scratch space for this worker's backends (RocksDB instances): nobody else's, so a dead
   * worker's can be deleted whole. */
  def localStateDir: File = StateWorker.localStateDir(slot)

  /** Notes the worker's resident memory now (from /proc), for its obituary should it be killed. */
  def sampleMemory(): Unit = WorkerDiagnosis.residentMemory(pid).foreach { case (rss, peak) =>
    lastRssBytes = rss
    peakRssBytes = math.max(peakRssBytes, peak)
  }

  def markDead(): Unit = {
    markedDead = true
    diedAbnormally = true
  }

  /** Kills a worker that stopped answering; its calls in flight fail as their sockets close. */
  def kill(): Unit = {
    markDead()
    process.destroyForcibly()
    process.waitFor(5, TimeUnit.SECONDS)
  }

  def shutdown(): Unit = {
    markedDead = true
    try process.getOutputStream.close() catch { case NonFatal(_) => } // EOF on stdin: worker exits
    // The worker closes its stores (deleting their local working files) before exiting.
    if (!process.waitFor(15, TimeUnit.SECONDS)) process.destroyForcibly()
    try gateway.shutdown() catch { case NonFatal(_) => }
    if (!diedAbnormally) StateWorker.deleteRecursively(exchangeDir)
  }
}

/**
 * The per-JVM pool of Python state workers (DESIGN §2): each started lazily by the first store that
 * needs it, shared by every provider in this JVM, restarted on the next call after it dies. A store
 * always goes to the same worker (by partition), where its local database lives. Also the calls
 * (bounded waits, health probes) and the JVM's work directories; WorkerProcess starts a worker.
 */
object StateWorker extends Logging {
  /** Must equal PROTOCOL_VERSION in python/pystatestore/worker/service.py; checked on every worker start. */
  val ProtocolVersion = 9

  /** Sized by the first store to acquire a worker (as the interpreter is); slots start empty. */
  private var pool: Array[RunningWorker] = _
  /** Per slot, a worker start in flight (its outcome), or null. */
  private var starting: Array[CompletableFuture[RunningWorker]] = _
  private var generations = 0
  private var anyDiedAbnormally = false
  /**
   * A worker that could not start, by interpreter and path, while none with them ever has in this
   * JVM: its error and when it may be tried again. Every store of this JVM gets that error until
   * then instead of starting (and waiting for) a worker of its own that fails the same way: one
   * start per JVM, not one per partition. The wait is short, so a fix made meanwhile (a package
   * installed) is picked up without a restart.
   */
  private val failedStarts = scala.collection.mutable.Map[(String, Option[String]), (String, Long)]()
  val RetryFailedStartAfterMs = 30000L
  /** Interpreters (and paths) a worker has started with in this JVM. */
  private val startedWith = scala.collection.mutable.Set[(String, Option[String])]()
  private implicit val formats: Formats = DefaultFormats

  /** Threads that make worker calls, so a caller can stop waiting for one that hangs. */
  private val callThreads = Executors.newCachedThreadPool(new ThreadFactory {
    private val n = new AtomicInteger()
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, s"pystatestore-call-${n.incrementAndGet()}")
      t.setDaemon(true)
      t
    }
  })

  sys.addShutdownHook {
    synchronized {
      Option(pool).toSeq.flatten.filter(_ != null).foreach { w =>
        w.shutdown()
        anyDiedAbnormally ||= w.diedAbnormally
      }
      // Logs of a worker that died are kept for diagnosis; otherwise nothing of ours stays behind.
      if (root != null) {
        if (!anyDiedAbnormally) deleteRecursively(root.dir)
        else Option(root.dir.listFiles()).foreach(_.filterNot(_.getName.endsWith(".log")).foreach(deleteRecursively))
      }
    }
  }

  private def poolFor(spec: WorkerLaunchSpec): Array[RunningWorker] = {
    if (pool == null) {
      pool = new Array[RunningWorker](spec.workers)
      starting = new Array[CompletableFuture[RunningWorker]](spec.workers)
    } else if (spec.workers != pool.length) {
      logDebug(s"pystatestore: ${pool.length} workers were started by the first store; ignoring workers=${spec.workers}")
    }
    pool
  }

  /**
   * Returns the live worker of a partition's slot, starting one if there is none or it died. A
   * start holds only its slot: the other slots' stores go on, and start their own workers side by
   * side. A caller that finds a start in flight (another task's, or a prestart) waits for it and
   * gets its outcome, its failure included: a worker that cannot start is never waited for twice.
   * Until a worker with this interpreter has started once in this JVM, slots start one at a time
   * (the others wait for the first start's outcome): a setup that cannot work fails once per JVM.
   */
  @scala.annotation.tailrec
  def acquire(spec: WorkerLaunchSpec, partitionId: Int): RunningWorker = {
    val (slot, outcome, mine, thenAgain) = acquireStep(spec, partitionId)
    if (mine) startInto(spec, slot, outcome)
    val worker = try outcome.get() catch { case e: ExecutionException => throw e.getCause }
    if (thenAgain) acquire(spec, partitionId) else worker
  }

  /**
   * What acquire does next, decided under the lock: (slot, the outcome to wait for, whether this
   * caller starts the worker, whether to decide again once it is known).
   */
  private def acquireStep(spec: WorkerLaunchSpec, partitionId: Int)
      : (Int, CompletableFuture[RunningWorker], Boolean, Boolean) = synchronized {
    val workers = poolFor(spec)
    val slot = Math.floorMod(partitionId, workers.length)
    val current = workers(slot)
    val firstStartElsewhere = if (startedWith.contains(startKey(spec))) None else starting.find(_ != null)
    if (current != null && current.isUsable) (slot, CompletableFuture.completedFuture(current), false, false)
    else if (starting(slot) != null) (slot, starting(slot), false, false)
    else if (failedStarts.get(startKey(spec)).exists(_._2 > System.currentTimeMillis())) {
      val (message, retryAt) = failedStarts(startKey(spec))
      val remembered = new StateWorkerDiedException(message + s" [This JVM tries a new worker with " +
        s"this Python from ${java.time.Instant.ofEpochMilli(retryAt)}.]", null)
      (slot, CompletableFuture.failedFuture[RunningWorker](remembered), false, false)
    } else if (firstStartElsewhere.isDefined) (slot, firstStartElsewhere.get, false, true)
    else {
      if (current != null) {
        if (!current.process.isAlive) current.diedAbnormally = true
        anyDiedAbnormally ||= current.diedAbnormally
        logWarning(s"${current.describe} is gone; starting a new one (its log: ${current.logFile})")
        current.shutdown()
        // Its local databases are nobody's now (views are the JVM's and live elsewhere): only its
        // log is worth keeping.
        deleteRecursively(current.localStateDir)
        deleteRecursively(current.exchangeDir)
        workers(slot) = null
      }
      starting(slot) = new CompletableFuture[RunningWorker]()
      (slot, starting(slot), true, false)
    }
  }

  private def startInto(spec: WorkerLaunchSpec, slot: Int, outcome: CompletableFuture[RunningWorker]): Unit =
    try {
      val worker = start(spec, slot)
      synchronized { pool(slot) = worker; starting(slot) = null; startedWith += startKey(spec) }
      outcome.complete(worker)
    } catch {
      case e: Throwable =>
        synchronized {
          starting(slot) = null
          // Only a setup that never worked is taken to fail again: once a worker has started with this
          // interpreter, a failed start (a log name taken, a worker killed mid-start) is its own.
          if (!startedWith.contains(startKey(spec))) failedStarts(startKey(spec)) =
            (Option(e.getMessage).getOrElse(e.toString), System.currentTimeMillis() + RetryFailedStartAfterMs)
          anyDiedAbnormally = true // its log, which the error names, stays after this JVM exits
        }
        outcome.completeExceptionally(e)
    }

  private def startKey(spec: WorkerLaunchSpec) = (spec.pythonExec, spec.pythonPath)

  /** Daemon threads that start workers ahead of a store's first call (`prestart`). */
  private val prestartThreads = Executors.newCachedThreadPool(new ThreadFactory {
    private val n = new AtomicInteger()
    override def newThread(r: Runnable): Thread = {
      val t = new Thread(r, s"pystatestore-prestart-${n.incrementAndGet()}")
      t.setDaemon(true)
      t
    }
  })
  private val warmedUp = new AtomicBoolean(false)

  /**
   * Starts the slot's worker in the background if it has none, and warms the JVM's side of the
   * bridge once per JVM (Arrow's allocator and IPC writer): a task opens its store before it
   * consumes its input, so these overlap that work instead of waiting in the first commit (about a
   * second in a fresh JVM: decision 0030). A failed start is logged here; the store's own call starts again
   * (or joins a start still in flight) and fails with the error that names what to do.
   */
  def prestart(spec: WorkerLaunchSpec, partitionId: Int): Unit = {
    if (warmedUp.compareAndSet(false, true)) {
      prestartThreads.submit(new Runnable {
        override def run(): Unit = try ArrowFrames.warmUp() catch {
          case NonFatal(e) => logDebug(s"pystatestore: warming up the bridge failed: $e")
        }
      })
    }
    val needed = synchronized {
      val workers = poolFor(spec)
      val slot = Math.floorMod(partitionId, workers.length)
      (workers(slot) == null || !workers(slot).isUsable) && starting(slot) == null
    }
    if (needed) prestartThreads.submit(new Runnable {
      override def run(): Unit = try acquire(spec, partitionId) catch {
        case NonFatal(e) =>
          logWarning(s"pystatestore: could not start a state worker ahead of its first call: ${e.getMessage}")
      }
    })
  }

  /**
   * Notes every live worker's resident memory each second (from /proc, a few microseconds each), so
   * a worker the kernel kills for memory is reported with what it used just before.
   */
  private lazy val memorySampler = {
    val sampler = Executors.newSingleThreadScheduledExecutor(new ThreadFactory {
      override def newThread(r: Runnable): Thread = {
        val t = new Thread(r, "pystatestore-memory-sampler")
        t.setDaemon(true)
        t
      }
    })
    sampler.scheduleWithFixedDelay(() => currentWorkers.filter(_.isUsable).foreach(_.sampleMemory()),
      0, 1, TimeUnit.SECONDS)
    sampler
  }

  /** For tests and the fault suite: the workers started and not replaced yet. */
  def currentWorkers: Seq[RunningWorker] = synchronized { Option(pool).toSeq.flatten.filter(_ != null) }

  /** The worker of a partition's slot now, if one was started; never starts one. */
  def workerFor(partitionId: Int): Option[RunningWorker] = synchronized {
    Option(pool).flatMap(p => Option(p(Math.floorMod(partitionId, p.length))))
  }

  private def died(worker: RunningWorker, state: (String, String), what: String, cause: Throwable) =
    new StateWorkerDiedException(
      s"${worker.describe} ${state._1} during $what.${if (state._2.isEmpty) "" else " " + state._2} Its log is " +
        s"at ${worker.logFile}. The task fails; Spark retries it and the next task starts a fresh worker that " +
        "reloads the state from the checkpoint.", cause)

  /** Does the worker still answer? A `hello` on its own connection, bounded by `timeoutMs`. */
  private def answers(worker: RunningWorker, timeoutMs: Long): Boolean = {
    val probe = callThreads.submit(() => worker.service.hello())
    try { probe.get(timeoutMs, TimeUnit.MILLISECONDS); true }
    catch { case NonFatal(_) => probe.cancel(true); false }
  }

  /**
   * Calls the worker with bounded waits. While the call runs, the worker is probed every
   * `probeIntervalMs`: one that stops answering (hung, frozen) is killed and the call fails as
   * "worker died"; a call that outlives `callTimeoutMs` on a worker that still answers fails alone
   * (StateWorkerTimeoutException) and leaves the worker serving other stores. A transport error on
   * a worker that still answers fails only this call, too.
   */
  def call(worker: RunningWorker, what: => String, spec: WorkerLaunchSpec)(
      f: PythonStateService => String): JValue = {
    val started = System.nanoTime()
    val future = callThreads.submit(() => f(worker.service))
    var reply: String = null
    while (reply == null) {
      val waitedMs = (System.nanoTime() - started) / 1000000
      val remaining = spec.callTimeoutMs - waitedMs
      if (remaining <= 0) {
        throw new StateWorkerTimeoutException(
          s"$what did not return within ${spec.callTimeoutMs} ms " +
            s"(${WorkerLaunchSpec.ConfPrefix}callTimeoutMs); ${worker.describe} still answers, so only " +
            s"this call failed. Its log is at ${worker.logFile}. Spark retries the task; the store is " +
            "reopened in a fresh state.")
      }
      try {
        reply = future.get(math.min(remaining, spec.probeIntervalMs), TimeUnit.MILLISECONDS)
      } catch {
        case _: TimeoutException =>
          if (!worker.process.isAlive || !answers(worker, spec.probeIntervalMs)) {
            val state = if (worker.process.isAlive) {
              worker.kill()
              (s"stopped answering (no reply to a health check within ${spec.probeIntervalMs} ms; killed)", "")
            } else WorkerDiagnosis.exit(worker)
            worker.markDead()
            throw died(worker, state, what, null)
          }
        case e: ExecutionException =>
          val cause = Option(e.getCause).getOrElse(e)
          worker.process.waitFor(1, TimeUnit.SECONDS)
          if (!worker.process.isAlive) {
            worker.markDead()
            throw died(worker, WorkerDiagnosis.exit(worker), what, cause)
          }
          if (!answers(worker, spec.probeIntervalMs)) {
            worker.kill()
            throw died(worker, ("stopped answering (killed)", ""), what, cause)
          }
          throw new StateWorkerException("TransportError",
            s"$what failed in transport (${cause.getMessage}); ${worker.describe} still answers and keeps " +
              s"serving other stores. Its log is at ${worker.logFile}.")
      }
    }
    val json = JsonMethods.parse(reply)
    json \ "error" match {
      case JNothing | JNull => json
      case err =>
        throw new StateWorkerException(
          (err \ "type").extractOrElse[String]("Error"),
          (err \ "message").extractOrElse[String](s"unknown error during $what") +
            s" [${worker.describe}; its log is at ${worker.logFile}]")
    }
  }

  /** Scratch space for one worker slot's local working files (RocksDB instances). */
  private[pystatestore] def localStateDir(slot: Int): File = {
    val dir = new File(new File(workRoot(), "stores"), s"w$slot")
    dir.mkdirs()
    dir
  }

  /**
   * Where the worker leaves read views (RocksDB checkpoints) for this JVM, on the same filesystem
   * as the local databases so views are hard links. The JVM owns them: it deletes each once closed.
   */
  def viewsDir: File = {
    val dir = new File(workRoot(), "views")
    dir.mkdirs()
    dir
  }

  /** This host's base directory for pystatestore: spark.local.dir, else java.io.tmpdir. */
  def hostDir: File = workRoot().getParentFile

  private def workBase(): File = new File(Option(SparkEnv.get).flatMap(_.conf.getOption("spark.local.dir"))
    .map(_.split(",").head.trim).filter(_.nonEmpty)
    .getOrElse(System.getProperty("java.io.tmpdir")))

  /**
   * Where worker logs, Arrow exchange files, local databases and views go (WorkRoot): made in
   * spark.local.dir, else java.io.tmpdir, once per JVM: after SparkContext.stop() SparkEnv is gone,
   * and the shutdown hook must clean the directory that was used, not recompute another one.
   */
  private var root: WorkRoot = _

  private def theRoot(): WorkRoot = synchronized {
    if (root == null) root = WorkRoot.create(workBase())
    root
  }

  private def workRoot(): File = synchronized { theRoot().verified() }

  private[pystatestore] def deleteRecursively(f: File): Unit = WorkRoot.deleteRecursively(f)

  private def start(spec: WorkerLaunchSpec, slot: Int): RunningWorker = {
    val generation = synchronized { generations += 1; generations }
    val worker = WorkerProcess.start(spec, slot, generation, theRoot())
    worker.sampleMemory()
    memorySampler
    checkProtocol(worker, spec)
    logInfo(s"Started ${worker.describe}; log at ${worker.logFile}")
    worker
  }

  /** Refuses a worker from another pystatestore release: it would misread our calls. */
  private def checkProtocol(worker: RunningWorker, spec: WorkerLaunchSpec): Unit = {
    val hello = try call(worker, "the start-up handshake", spec.copy(callTimeoutMs = spec.startTimeoutMs))(
      _.hello()) catch {
      case NonFatal(e) =>
        worker.shutdown()
        throw e
    }
    val protocol = (hello \ "protocol").extractOrElse[Int](-1)
    val theirs = (hello \ "version").extractOrElse[String]("an unknown version")
    // Another release is refused even when it speaks this protocol: checkpoint formats and
    // defaults move between releases, and the pair is tested only as one release.
    if (protocol != ProtocolVersion || theirs != Release.Version) {
      worker.shutdown()
      throw new StateWorkerDiedException(WorkerDiagnosis.otherRelease(spec, theirs, protocol, ProtocolVersion), null)
    }
  }
}
