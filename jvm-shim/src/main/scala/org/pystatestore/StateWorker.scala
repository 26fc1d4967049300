package org.pystatestore

import java.io.{File, RandomAccessFile}
import java.net.InetAddress
import java.nio.charset.StandardCharsets
import java.nio.file.Files
import java.security.SecureRandom
import java.util.concurrent.{CountDownLatch, TimeUnit}

import scala.util.control.NonFatal

import org.json4s._
import org.json4s.jackson.JsonMethods
import javax.net.SocketFactory
import py4j.{CallbackClient, GatewayServer}

import org.apache.spark.SparkEnv
import org.apache.spark.internal.Logging

/** The worker process died or could not be reached; the task should fail and be retried. */
class StateWorkerDiedException(message: String, cause: Throwable)
  extends RuntimeException(message, cause)

/** The worker answered with an error of its own (bad checkpoint, failed upload, ...). */
class StateWorkerException(val errorType: String, message: String)
  extends RuntimeException(message)

/** How to start the Python worker: resolved from provider confs, Spark conf and environment. */
case class WorkerLaunchSpec(pythonExec: String, pythonPath: Option[String], startTimeoutMs: Long)

object WorkerLaunchSpec {
  val ConfPrefix = "spark.sql.streaming.stateStore.pystatestore."

  /** Interpreter: provider conf, else spark.pyspark.python, else PYSPARK_PYTHON, else python3. */
  def resolve(providerConfs: Map[String, String]): WorkerLaunchSpec = {
    val sparkConf = Option(SparkEnv.get).map(_.conf)
    val exec = providerConfs.get(ConfPrefix + "pythonExec")
      .orElse(sparkConf.flatMap(_.getOption("spark.pyspark.python")))
      .orElse(sys.env.get("PYSPARK_PYTHON"))
      .getOrElse("python3")
    WorkerLaunchSpec(
      exec,
      providerConfs.get(ConfPrefix + "pythonPath").filter(_.nonEmpty),
      providerConfs.getOrElse(ConfPrefix + "workerStartTimeoutMs", "60000").toLong)
  }
}

/**
 * One running Python worker: its process, the Py4J gateway it talks to, and the service proxy it
 * registered. Instances are replaced, never revived: once dead, `StateWorker.acquire` starts anew.
 */
final class RunningWorker private[pystatestore] (
    val generation: Int,
    val process: Process,
    val logFile: File,
    val exchangeDir: File,
    gateway: GatewayServer,
    val service: PythonStateService) {

  @volatile private var markedDead = false

  def pid: Long = process.pid()

  /** Where the worker reaches this JVM (loopback only); exposed for diagnostics and tests. */
  def gatewayPort: Int = gateway.getListeningPort

  def gatewayAddress: String = gateway.getAddress.getHostAddress

  def isUsable: Boolean = !markedDead && process.isAlive

  def describe: String = s"pystatestore state worker (pid $pid, generation $generation)"

  def markDead(): Unit = markedDead = true

  def shutdown(): Unit = {
    markedDead = true
    try process.getOutputStream.close() catch { case NonFatal(_) => } // EOF on stdin: worker exits
    if (!process.waitFor(3, TimeUnit.SECONDS)) process.destroyForcibly()
    try gateway.shutdown() catch { case NonFatal(_) => }
  }
}

/** Entry point the Python worker calls once, to hand over its service and callback port. */
final class WorkerRegistration(token: String) {
  private val latch = new CountDownLatch(1)
  @volatile private var registered: PythonStateService = _
  @volatile private[pystatestore] var server: GatewayServer = _

  def register(service: PythonStateService, callbackPort: Int): Unit = {
    // The callback client keeps the auth token; only the port is learned here.
    server.resetCallbackClient(InetAddress.getLoopbackAddress, callbackPort)
    registered = service
    latch.countDown()
  }

  private[pystatestore] def await(ms: Long): Option[PythonStateService] =
    if (latch.await(ms, TimeUnit.MILLISECONDS)) Some(registered) else None
}

/**
 * The per-JVM Python state worker (DESIGN §2): started lazily by the first store that needs it,
 * shared by every provider in this JVM, restarted on the next call after it dies.
 */
object StateWorker extends Logging {
  private val ProtocolVersion = 1
  private var current: RunningWorker = _
  private var generations = 0
  private implicit val formats: Formats = DefaultFormats

  sys.addShutdownHook { synchronized { if (current != null) current.shutdown() } }

  /** Returns a live worker, starting one if there is none or the last one died. */
  def acquire(spec: WorkerLaunchSpec): RunningWorker = synchronized {
    if (current == null || !current.isUsable) {
      if (current != null) {
        logWarning(s"${current.describe} is gone; starting a new one (its log: ${current.logFile})")
        current.shutdown()
      }
      current = start(spec)
    }
    current
  }

  /** For tests and the fault suite: the worker in use now, if any. */
  def currentWorker: Option[RunningWorker] = synchronized { Option(current) }

  /** Calls the worker; turns transport failures into a clear "worker died" error. */
  def call(worker: RunningWorker, what: => String)(f: PythonStateService => String): JValue = {
    val reply = try f(worker.service) catch {
      case NonFatal(e) =>
        worker.process.waitFor(2, TimeUnit.SECONDS)
        worker.markDead()
        val state = if (worker.process.isAlive) "stopped answering" else
          s"died (exit code ${worker.process.exitValue()})"
        throw new StateWorkerDiedException(
          s"${worker.describe} $state during $what. Its log is at ${worker.logFile}. " +
            "The task fails; Spark retries it and the next task starts a fresh worker that " +
            "reloads the state from the checkpoint.", e)
    }
    val json = JsonMethods.parse(reply)
    json \ "error" match {
      case JNothing | JNull => json
      case err =>
        throw new StateWorkerException(
          (err \ "type").extractOrElse[String]("Error"),
          (err \ "message").extractOrElse[String](s"unknown error during $what"))
    }
  }

  private def newToken(): String = {
    val bytes = new Array[Byte](32)
    new SecureRandom().nextBytes(bytes)
    bytes.map("%02x".format(_)).mkString
  }

  /** Scratch space for backends' local working files (RocksDB instances), per JVM. */
  def localStateDir: File = {
    val dir = new File(workRoot(), "stores")
    dir.mkdirs()
    dir
  }

  /** Where worker logs and Arrow exchange files go: spark.local.dir, else java.io.tmpdir. */
  private def workRoot(): File = {
    val base = Option(SparkEnv.get).flatMap(_.conf.getOption("spark.local.dir"))
      .map(_.split(",").head.trim).filter(_.nonEmpty)
      .getOrElse(System.getProperty("java.io.tmpdir"))
    val dir = new File(base, s"pystatestore-${ProcessHandle.current().pid()}")
    dir.mkdirs()
    dir
  }

  private def start(spec: WorkerLaunchSpec): RunningWorker = {
    generations += 1
    val root = workRoot()
    val exchangeDir = Files.createTempDirectory(root.toPath, s"xfer-$generations-").toFile
    val logFile = new File(root, s"worker-$generations.log")
    val token = newToken()
    val registration = new WorkerRegistration(token)
    // Gateway threads inherit this loader, so Py4J can resolve our interface by name even when
    // the shim jar came in through spark.jars rather than the system class path.
    val thread = Thread.currentThread()
    val previousLoader = thread.getContextClassLoader
    thread.setContextClassLoader(getClass.getClassLoader)
    val server = try {
      val s = new GatewayServer.GatewayServerBuilder()
        .entryPoint(registration)
        .javaPort(0)
        .javaAddress(InetAddress.getLoopbackAddress)
        .authToken(token)
        // minConnectionTime 0: no idle-connection cleaner, whose non-daemon thread would keep a
        // driver JVM alive after main() returns. copyWith (on register) keeps this setting.
        .callbackClient(new CallbackClient(0, InetAddress.getLoopbackAddress, token, 0L,
          TimeUnit.SECONDS, SocketFactory.getDefault, true, 0))
        .build()
      registration.server = s
      s.start(true)
      s
    } finally thread.setContextClassLoader(previousLoader)

    val command = new java.util.ArrayList[String]()
    command.add(spec.pythonExec)
    command.add("-m")
    command.add("pystatestore.worker")
    val pb = new ProcessBuilder(command)
    val env = pb.environment()
    // Port and token go through the environment, never the command line (visible to `ps`).
    env.put("PYSTATESTORE_GATEWAY_PORT", server.getListeningPort.toString)
    env.put("PYSTATESTORE_GATEWAY_TOKEN", token)
    env.put("PYSTATESTORE_PROTOCOL", ProtocolVersion.toString)
    spec.pythonPath.foreach { p =>
      env.put("PYTHONPATH", (p +: Option(env.get("PYTHONPATH")).toSeq).mkString(File.pathSeparator))
    }
    pb.redirectErrorStream(true)
    pb.redirectOutput(ProcessBuilder.Redirect.appendTo(logFile))
    val process = try pb.start() catch {
      case NonFatal(e) =>
        server.shutdown()
        throw new StateWorkerDiedException(
          s"Could not start the pystatestore state worker with '${spec.pythonExec}': ${e.getMessage}. " +
            s"Set ${WorkerLaunchSpec.ConfPrefix}pythonExec (or spark.pyspark.python) to a Python " +
            "that has the pystatestore package installed.", e)
    }

    val deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(spec.startTimeoutMs)
    var service: Option[PythonStateService] = None
    while (service.isEmpty && process.isAlive && System.nanoTime() < deadline) {
      service = registration.await(100)
    }
    if (service.isEmpty) {
      if (process.isAlive) process.destroyForcibly()
      server.shutdown()
      val why = if (process.isAlive) s"did not register within ${spec.startTimeoutMs} ms"
        else s"exited with code ${process.waitFor()} before registering"
      throw new StateWorkerDiedException(
        s"The pystatestore state worker ('${spec.pythonExec} -m pystatestore.worker') $why. " +
          s"Last lines of its log ($logFile):\n${tail(logFile)}\n" +
          s"Check that this Python can import pystatestore, pyarrow and py4j, or set " +
          s"${WorkerLaunchSpec.ConfPrefix}pythonExec / ${WorkerLaunchSpec.ConfPrefix}pythonPath.",
        null)
    }
    val worker = new RunningWorker(generations, process, logFile, exchangeDir, server, service.get)
    logInfo(s"Started ${worker.describe}; log at $logFile")
    worker
  }

  private def tail(file: File, maxBytes: Int = 4000): String = try {
    val raf = new RandomAccessFile(file, "r")
    try {
      val start = math.max(0L, raf.length() - maxBytes)
      val buf = new Array[Byte]((raf.length() - start).toInt)
      raf.seek(start)
      raf.readFully(buf)
      new String(buf, StandardCharsets.UTF_8)
    } finally raf.close()
  } catch { case NonFatal(_) => "(log unreadable)" }
}
