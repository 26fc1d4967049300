package org.pystatestore

import java.io.File
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import scala.util.control.NonFatal

/**
 * Why a worker could not start or died, in words a user can act on. PySpark shows a query's error
 * without its Java cause chain, so what is found here ends up in the message of Spark's own error
 * (SparkInternals): the interpreter, the module it lacks, the release it has, the kernel's
 * out-of-memory killer.
 */
private[pystatestore] object WorkerDiagnosis {
  /** The Python packages the worker imports at start; pystatestore brings the other three. */
  val WorkerPackages = Seq("pystatestore", "rocksdict", "pyarrow", "py4j")

  private def pipInstall(python: String) = s"'$python' -m pip install pystatestore==${Release.Version}"

  private def whereToSet = s"or set ${WorkerLaunchSpec.ConfPrefix}pythonExec to a Python that has it " +
    s"(and ${WorkerLaunchSpec.ConfPrefix}pythonPath where it is not installed; pystatestore.configure_spark " +
    "sets both to the Python that configured the session)"

  /** The interpreter could not be run at all (ProcessBuilder.start failed). */
  def cannotRun(spec: WorkerLaunchSpec, e: Throwable): String = {
    val file = new File(spec.pythonExec)
    val onPath = !spec.pythonExec.contains(File.separator)
    val what = if (onPath) s"no program '${spec.pythonExec}' on this JVM's PATH (${e.getMessage})"
      else if (!file.exists()) s"'${spec.pythonExec}' does not exist on this host"
      else if (file.isDirectory) s"'${spec.pythonExec}' is a directory, not a Python interpreter"
      else if (!file.canExecute) s"'${spec.pythonExec}' is not executable by this user"
      else s"it could not be run (${e.getMessage})"
    s"pystatestore could not start its state worker: the Python interpreter set by ${spec.pythonExecFrom} " +
      s"is unusable: $what. Set ${WorkerLaunchSpec.ConfPrefix}pythonExec (or spark.pyspark.python) to the path " +
      s"of a Python that has pystatestore ${Release.Version} installed on every executor host."
  }

  private val ModuleMissing = "ModuleNotFoundError: No module named '([A-Za-z0-9_.]+)'".r.unanchored
  /** The last line of a Python traceback: `SomeError: text` (a dotted name allowed). */
  private val PythonError = "^([A-Za-z_][A-Za-z0-9_.]*(?:Error|Exception|Exit)): (.*)$".r

  /** The worker exited or hung before it registered; `log` is the end of its output. */
  def didNotRegister(spec: WorkerLaunchSpec, why: String, logFile: File, log: String): String = {
    val python = spec.pythonExec
    val head = s"The pystatestore state worker ('$python -m pystatestore.worker', the Python set by " +
      s"${spec.pythonExecFrom}) $why"
    log match {
      case ModuleMissing(module) if WorkerPackages.contains(module.split('.').head) =>
        s"$head: that Python cannot import ${module.split('.').head}. Install pystatestore ${Release.Version} " +
          s"for it on every executor host (${pipInstall(python)}; it brings rocksdict, pyarrow and py4j), " +
          s"$whereToSet. Its log: $logFile."
      case _ =>
        s"$head${lastPythonError(log).map(err => s": $err.").getOrElse(".")} Check that this Python can " +
          s"import ${WorkerPackages.mkString(", ")} (${pipInstall(python)}), $whereToSet. Last lines of its " +
          s"log ($logFile):\n$log"
    }
  }

  private def lastPythonError(log: String): Option[String] =
    log.split('\n').reverseIterator.map(_.trim).collectFirst { case l @ PythonError(_, _) => l }

  /** The worker runs another release than this jar's: refused, whatever protocol it speaks. */
  def otherRelease(spec: WorkerLaunchSpec, theirs: String, protocol: Int, ours: Int): String =
    s"The pystatestore state worker ('${spec.pythonExec} -m pystatestore.worker', the Python set by " +
      s"${spec.pythonExecFrom}) runs pystatestore $theirs (protocol $protocol), but this jar is pystatestore " +
      s"${Release.Version} (protocol $ours): the worker and the jar must come from the same release. Install " +
      s"pystatestore ${Release.Version} for that Python (${pipInstall(spec.pythonExec)}), or use the jar of " +
      s"pystatestore $theirs (pystatestore.jar_path() in that Python), " + whereToSet + "."

  /**
   * How a worker that died is described, and what to do: its exit code, the signal that ended it,
   * and whether the kernel's out-of-memory killer is known (its memory cgroup counted a kill since
   * the worker started) or likely (SIGKILL) to have done it, with the worker's memory use.
   */
  def exit(worker: RunningWorker): (String, String) = exit(worker.process.exitValue(), worker.lastRssBytes,
    worker.peakRssBytes, worker.memoryCgroup, worker.oomKillsAtStart)

  /** `exit` of a worker that ended with `code`, its memory as last sampled, its cgroup's kills at its start. */
  def exit(code: Int, lastRssBytes: Long, peakRssBytes: Long, memoryCgroup: Option[MemoryCgroup],
      oomKillsAtStart: Option[Long]): (String, String) = {
    // Java reports a process ended by signal N as exit code 128 + N.
    val signal = if (code > 128 && code < 128 + 65) Some(code - 128) else None
    val rss = if (lastRssBytes > 0) {
      val peak = if (peakRssBytes > lastRssBytes) s", peak ${peakRssBytes >> 20} MiB" else ""
      s"; its resident memory was last seen at ${lastRssBytes >> 20} MiB$peak"
    } else "; its resident memory was never sampled"
    val memoryAdvice = "Give the executors more memory outside the JVM heap (spark.executor.memoryOverhead), or " +
      s"run fewer workers per executor (${WorkerLaunchSpec.ConfPrefix}workers)"
    val oom = memoryCgroup.flatMap(c => c.killsSince(oomKillsAtStart).map(c -> _))
    (signal, oom) match {
      case (_, Some((cgroup, kills))) if kills > 0 =>
        (s"died, killed by the kernel's out-of-memory killer (exit code $code; its memory cgroup ${cgroup.path}" +
          s"${cgroup.limitText} counted $kills kill(s) since it started$rss)", s"$memoryAdvice, or raise that limit.")
      case (Some(9), _) =>
        (s"died, killed by SIGKILL (exit code $code$rss)", "The kernel's out-of-memory killer ends processes this " +
          "way (the host's kernel log, dmesg, says so if it did), as do resource managers and users. If it was " +
          s"memory: $memoryAdvice.")
      case (Some(s), _) => (s"died, ended by signal $s (exit code $code$rss)", "")
      case _ => (s"died (exit code $code$rss)", "")
    }
  }

  /** (VmRSS, VmHWM) of a live process, in bytes, from /proc (`proc`: another root, for tests). */
  def residentMemory(pid: Long, proc: File = new File("/proc")): Option[(Long, Long)] = try {
    val fields = new String(Files.readAllBytes(new File(proc, s"$pid/status").toPath), StandardCharsets.UTF_8)
      .split('\n').map(_.split(":\\s+", 2)).collect { case Array(k, v) => k -> v }.toMap
    def kib(name: String) = fields.get(name).map(_.trim.stripSuffix(" kB").trim.toLong * 1024)
    for (rss <- kib("VmRSS"); peak <- kib("VmHWM")) yield (rss, peak)
  } catch { case NonFatal(_) => None }

  /** A process's memory cgroup (v2 unified or v1 memory controller), where its OOM kills are counted. */
  final case class MemoryCgroup(path: String, eventsFile: File, limitFile: Option[File]) {
    def oomKills: Option[Long] = readCounter(eventsFile, "oom_kill")

    def killsSince(before: Option[Long]): Option[Long] = for (b <- before; now <- oomKills) yield now - b

    def limitText: String = limitFile.flatMap(f => readFirstLine(f))
      .flatMap(v => scala.util.Try(v.trim.toLong).toOption)
      .filter(l => l > 0 && l < (1L << 60)).map(l => s" (limit ${l >> 20} MiB)").getOrElse("")
  }

  /**
   * The memory cgroup of process `pid`, if this host exposes one with an OOM-kill counter: the v1
   * memory controller's (`memory.oom_control`) or cgroup v2's (`memory.events`), as
   * `<proc>/<pid>/cgroup` names them under `cgroupFs` (other roots: for tests).
   */
  def memoryCgroup(pid: Long, proc: File = new File("/proc"), cgroupFs: File = new File("/sys/fs/cgroup"))
      : Option[MemoryCgroup] = try {
    val lines = new String(Files.readAllBytes(new File(proc, s"$pid/cgroup").toPath), StandardCharsets.UTF_8)
      .split('\n')
    val v1 = lines.collectFirst {
      case l if l.split(":", 3).length == 3 && l.split(":", 3)(1).split(',').contains("memory") => l.split(":", 3)(2)
    }.map { p =>
      val dir = new File(cgroupFs, "memory" + p)
      MemoryCgroup(p, new File(dir, "memory.oom_control"), Some(new File(dir, "memory.limit_in_bytes")))
    }
    val v2 = lines.collectFirst { case l if l.startsWith("0::") => l.substring(3) }.map { p =>
      val dir = new File(cgroupFs.getPath + p)
      MemoryCgroup(p, new File(dir, "memory.events"), Some(new File(dir, "memory.max")))
    }
    (v1.toSeq ++ v2.toSeq).find(_.oomKills.isDefined)
  } catch { case NonFatal(_) => None }

  private def readCounter(file: File, name: String): Option[Long] = try {
    new String(Files.readAllBytes(file.toPath), StandardCharsets.UTF_8).split('\n')
      .map(_.trim.split("\\s+")).collectFirst { case Array(`name`, v) => v.toLong }
  } catch { case NonFatal(_) => None }

  private def readFirstLine(file: File): Option[String] = try {
    new String(Files.readAllBytes(file.toPath), StandardCharsets.UTF_8).split('\n').headOption
  } catch { case NonFatal(_) => None }
}
