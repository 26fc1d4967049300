package org.pystatestore

import java.io.{File, RandomAccessFile}
import java.net.InetAddress
import java.nio.charset.StandardCharsets
import java.nio.file.Files
import java.security.SecureRandom
import java.util.concurrent.{CountDownLatch, TimeUnit}

import scala.util.control.NonFatal

import javax.net.SocketFactory
import py4j.{CallbackClient, GatewayServer}

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
 * Starting one Python worker process for the pool (StateWorker): its Py4J gateway on loopback with
 * a fresh token, the process with its allocator settings, the handshake over its stdin, and its
 * registration. The pool then checks that it speaks this jar's protocol.
 */
private[pystatestore] object WorkerProcess {
  /**
   * The worker's allocators, set where the user has not: memory a commit frees goes back to the
   * system instead of waiting in allocator caches, which RSS counts. Few glibc arenas (each thread,
   * uploads and RocksDB's, would get one); allocations from 64 KiB up (change frame batches, chunk
   * encodings) mmapped and unmapped on free; Arrow's buffers on that allocator rather than
   * mimalloc's own pages. Two stores, 8 commits of 250k keys each: peak 47 -> 37 MiB anonymous.
   */
  val WorkerAllocatorEnv: Seq[(String, String)] = Seq(
    "MALLOC_ARENA_MAX" -> "2",
    "MALLOC_MMAP_THRESHOLD_" -> "65536",
    "ARROW_DEFAULT_MEMORY_POOL" -> "system")

  /**
   * Starts the worker of `generation` for pool slot `slot`; its log and exchange directory go under
   * `root`. Fails with StateWorkerDiedException, naming what to do, if it cannot start or register
   * (with an IOException naming the directory if the root or the log cannot be ours alone).
   */
  def start(spec: WorkerLaunchSpec, slot: Int, generation: Int, root: WorkRoot): RunningWorker = {
    val logFile = root.newLog(generation)
    val exchangeDir = Files.createTempDirectory(root.dir.toPath, s"xfer-$generation-").toFile
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
        // readTimeout: a call stuck in the worker past callTimeoutMs (which already failed its
        // task) gives back its thread and connection soon after, instead of holding them forever.
        .callbackClient(new CallbackClient(0, InetAddress.getLoopbackAddress, token, 0L,
          TimeUnit.SECONDS, SocketFactory.getDefault, true, readTimeoutMs(spec)))
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
    WorkerAllocatorEnv.foreach { case (name, value) => if (env.get(name) == null) env.put(name, value) }
    spec.pythonPath.foreach { p =>
      env.put("PYTHONPATH", (p +: Option(env.get("PYTHONPATH")).toSeq).mkString(File.pathSeparator))
    }
    pb.redirectErrorStream(true)
    // appendTo opens the log by name, following links: safe only because newLog has just created
    // it in the root, a 0700 directory of this user where no one else can put a link in its place.
    pb.redirectOutput(ProcessBuilder.Redirect.appendTo(logFile))
    val process = try pb.start() catch {
      case NonFatal(e) =>
        server.shutdown()
        throw new StateWorkerDiedException(WorkerDiagnosis.cannotRun(spec, e), e)
    }

    // Port and token go over the worker's stdin, which stays open as its lifeline: never on its
    // command line (visible to `ps`) nor in its environment (readable in /proc/<pid>/environ).
    try {
      val stdin = process.getOutputStream
      stdin.write(s"""{"port": ${server.getListeningPort}, "token": "$token"}\n""".getBytes(StandardCharsets.UTF_8))
      stdin.flush()
    } catch { case NonFatal(_) => } // a worker that exited at once is reported below with its log

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
      throw new StateWorkerDiedException(WorkerDiagnosis.didNotRegister(spec, why, logFile, tail(logFile)), null)
    }
    new RunningWorker(generation, slot, process, logFile, exchangeDir, server, service.get)
  }

  private def readTimeoutMs(spec: WorkerLaunchSpec): Int =
    math.min(Int.MaxValue.toLong, spec.callTimeoutMs + 2 * spec.probeIntervalMs).toInt

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

  private def newToken(): String = {
    val bytes = new Array[Byte](32)
    new SecureRandom().nextBytes(bytes)
    bytes.map("%02x".format(_)).mkString
  }
}
