package org.pystatestore

import java.io.File
import java.nio.charset.StandardCharsets
import java.nio.file.Files

import org.scalatest.funsuite.AnyFunSuite

/**
 * Why a worker died or did not start (WorkerDiagnosis.scala), in the words a user reads. The OOM
 * kill is told from the worker's memory cgroup: its counters are read here from fake /proc and
 * /sys/fs/cgroup trees laid out as the kernel lays out cgroup v1 and v2 (the end-to-end test of a
 * real OOM kill, tests/test_first_error.py, needs a cgroup v1 memory group it can make, so cgroup v2
 * is judged here only), and from this host's own.
 */
class WorkerDiagnosisSuite extends AnyFunSuite {
  private val WorkerPid = 4242L
  private val MiB = 1L << 20

  /** A fake host: /proc/<WorkerPid>/cgroup holding `cgroupLines`, and `files` under its /sys/fs/cgroup. */
  private final class FakeHost(cgroupLines: String, files: (String, String)*) {
    private val root = Files.createTempDirectory("pystatestore-cgroup-test").toFile
    val proc = new File(root, "proc")
    val cgroupFs = new File(root, "sys/fs/cgroup")
    write(new File(proc, s"$WorkerPid/cgroup"), cgroupLines)
    files.foreach { case (path, text) => write(new File(cgroupFs, path), text) }

    def write(f: File, text: String): Unit = {
      f.getParentFile.mkdirs()
      Files.write(f.toPath, text.getBytes(StandardCharsets.UTF_8))
    }
    def set(path: String, text: String): Unit = write(new File(cgroupFs, path), text)
    def cgroup: Option[WorkerDiagnosis.MemoryCgroup] = WorkerDiagnosis.memoryCgroup(WorkerPid, proc, cgroupFs)
  }

  /** memory.events of a cgroup v2 group, as the kernel writes it. */
  private def v2Events(oomKills: Int): String =
    s"low 0\nhigh 0\nmax 41\noom ${oomKills + 3}\noom_kill $oomKills\noom_group_kill 0\n"

  test("cgroup v2: a kill counted in memory.events since the worker started is named, with its group and memory.max") {
    val scope = "/system.slice/spark-executor-3.scope"
    val host = new FakeHost(s"0::$scope\n",
      s"$scope/memory.events" -> v2Events(2), s"$scope/memory.max" -> s"${90 * MiB}\n")
    val cgroup = host.cgroup.getOrElse(fail("the worker's cgroup v2 group was not found"))
    assert(cgroup.path == scope && cgroup.oomKills == Some(2L) && cgroup.limitText == " (limit 90 MiB)")
    val atStart = cgroup.oomKills

    // Killed by something else: the count did not move.
    val (notOom, _) = WorkerDiagnosis.exit(137, 300 * MiB, 350 * MiB, Some(cgroup), atStart)
    assert(notOom.startsWith("died, killed by SIGKILL (exit code 137"), notOom)

    host.set(s"$scope/memory.events", v2Events(3)) // the kernel's OOM killer took the worker
    assert(cgroup.killsSince(atStart) == Some(1L))
    val (what, advice) = WorkerDiagnosis.exit(137, 300 * MiB, 350 * MiB, Some(cgroup), atStart)
    assert(what == s"died, killed by the kernel's out-of-memory killer (exit code 137; its memory cgroup $scope " +
      "(limit 90 MiB) counted 1 kill(s) since it started; its resident memory was last seen at 300 MiB, peak 350 MiB)")
    assert(advice.contains("spark.executor.memoryOverhead") && advice.contains("raise that limit"), advice)

    host.set(s"$scope/memory.max", "max\n") // no limit of its own
    assert(cgroup.limitText == "")
    val (unlimited, _) = WorkerDiagnosis.exit(137, 0, 0, Some(cgroup), atStart)
    assert(unlimited.contains(s"its memory cgroup $scope counted 1 kill(s)"), unlimited)
  }

  test("cgroup v2 at the root of a container's namespace (0::/)") {
    val host = new FakeHost("0::/\n", "memory.events" -> v2Events(0), "memory.max" -> s"${2048 * MiB}\n")
    val cgroup = host.cgroup.getOrElse(fail("the root group was not found"))
    assert(cgroup.path == "/" && cgroup.oomKills == Some(0L) && cgroup.limitText == " (limit 2048 MiB)")
  }

  test("cgroup v1: memory.oom_control's oom_kill and memory.limit_in_bytes of the memory controller's group") {
    val group = "/process_api/8b3b86939d0561bf"
    val lines = s"9:name=systemd:/\n8:pids:/\n4:memory:$group\n2:cpuacct,cpu:/\n0::/\n" // a hybrid host, as this one
    val host = new FakeHost(lines,
      s"memory$group/memory.oom_control" -> "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n",
      s"memory$group/memory.limit_in_bytes" -> "9223372036854771712\n") // no limit: the page-rounded maximum
    val cgroup = host.cgroup.getOrElse(fail("the v1 memory group was not found"))
    assert(cgroup.path == group && cgroup.oomKills == Some(4L) && cgroup.limitText == "")
    host.set(s"memory$group/memory.limit_in_bytes", s"${90 * MiB}\n")
    assert(cgroup.limitText == " (limit 90 MiB)")
  }

  test("a v1 memory group without an oom_kill counter (kernels before 4.13) gives way to the v2 group's") {
    val host = new FakeHost("5:memory:/old\n0::/new\n",
      "memory/old/memory.oom_control" -> "oom_kill_disable 0\nunder_oom 0\n",
      "new/memory.events" -> v2Events(7))
    assert(host.cgroup.map(c => c.path -> c.oomKills) == Some("/new" -> Some(7L)))
  }

  test("no counter anywhere, or no such process: no cgroup, and the exit is told by its code and signal") {
    assert(new FakeHost("0::/empty\n4:cpu:/\n").cgroup.isEmpty)
    assert(WorkerDiagnosis.memoryCgroup(WorkerPid + 1, new FakeHost("0::/\n").proc).isEmpty)

    val (killed, advice) = WorkerDiagnosis.exit(137, 0, 0, None, None)
    assert(killed == "died, killed by SIGKILL (exit code 137; its resident memory was never sampled)")
    assert(advice.contains("dmesg"))
    assert(WorkerDiagnosis.exit(143, 5 * MiB, 5 * MiB, None, None) ==
      ("died, ended by signal 15 (exit code 143; its resident memory was last seen at 5 MiB)", ""))
    assert(WorkerDiagnosis.exit(1, 0, 0, None, None)._1 == "died (exit code 1; its resident memory was never sampled)")
  }

  test("this host's own cgroup files read as the kernel writes them") {
    val pid = ProcessHandle.current().pid()
    val lines = new String(Files.readAllBytes(new File(s"/proc/$pid/cgroup").toPath), StandardCharsets.UTF_8).split('\n')
    // Where this test expects a counter, read its own way: the v1 memory controller's group, the v2 group.
    val v1 = lines.map(_.split(":", 3)).collect { case Array(_, cs, p) if cs.split(',').contains("memory") =>
      p -> new File(s"/sys/fs/cgroup/memory$p/memory.oom_control") }
    val v2 = lines.collect { case l if l.startsWith("0::") =>
      l.drop(3) -> new File(s"/sys/fs/cgroup${l.drop(3)}/memory.events") }
    val counted = (v1 ++ v2).filter { case (_, f) =>
      f.isFile &&
        new String(Files.readAllBytes(f.toPath), StandardCharsets.UTF_8).linesIterator.exists(_.startsWith("oom_kill "))
    }
    val found = WorkerDiagnosis.memoryCgroup(pid)
    assert(found.map(_.path) == counted.headOption.map(_._1), s"/proc/$pid/cgroup: ${lines.mkString(" | ")}")
    found.foreach(c => assert(c.oomKills.exists(_ >= 0)))
    val Some((rss, peak)) = WorkerDiagnosis.residentMemory(pid)
    assert(rss > 0 && peak >= rss)
  }

  test("resident memory comes from VmRSS and VmHWM of /proc/<pid>/status, in bytes") {
    val host = new FakeHost("0::/\n")
    host.write(new File(host.proc, s"$WorkerPid/status"), "Name:\tpython3\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n")
    assert(WorkerDiagnosis.residentMemory(WorkerPid, host.proc) == Some((100 * MiB, 200 * MiB)))
    host.write(new File(host.proc, s"$WorkerPid/status"), "Name:\tzombie\nState:\tZ (zombie)\n")
    assert(WorkerDiagnosis.residentMemory(WorkerPid, host.proc).isEmpty)
  }

  private val spec = WorkerLaunchSpec("/opt/py/bin/python3", None, 1000L, pythonExecFrom = "spark.pyspark.python")
  private val log = new File("/tmp/pystatestore-1-2/worker-1.log")
  private val traceback =
    "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 189, in _run_module_as_main\n"

  test("a worker whose Python lacks one of the worker's packages is told to install pystatestore for it") {
    val told = WorkerDiagnosis.didNotRegister(spec, "exited with code 1 before it registered", log,
      traceback + "ModuleNotFoundError: No module named 'pyarrow.lib'\n")
    assert(told.startsWith("The pystatestore state worker ('/opt/py/bin/python3 -m pystatestore.worker', the Python " +
      "set by spark.pyspark.python) exited with code 1 before it registered: that Python cannot import pyarrow."), told)
    assert(told.contains(s"'/opt/py/bin/python3' -m pip install pystatestore==${Release.Version}") &&
      told.endsWith(s"Its log: $log."), told)
  }

  test("any other start failure names the traceback's last error and shows the log's last lines") {
    val tail = traceback + "ValueError: an earlier one\nDuring handling of the above exception:\n" +
      "pystatestore.store.errors.StoreError: the local directory is full\n  (a line after it)\n"
    val told = WorkerDiagnosis.didNotRegister(spec, "exited with code 1", log, tail)
    assert(told.contains("exited with code 1: pystatestore.store.errors.StoreError: the local directory is full."), told)
    assert(told.endsWith(s"Last lines of its log ($log):\n$tail"))
    val numpy = WorkerDiagnosis.didNotRegister(spec, "exited", log, "ModuleNotFoundError: No module named 'numpy'\n")
    assert(numpy.contains("exited: ModuleNotFoundError: No module named 'numpy'.") && !numpy.contains("cannot import"))
    assert(WorkerDiagnosis.didNotRegister(spec, "hung", log, "nothing useful\n").contains("hung. Check that this Python"))
  }

  test("an interpreter that cannot be run is told apart: not on PATH, missing, a directory, not executable") {
    val e = new java.io.IOException("error=2, No such file or directory")
    def told(exec: String): String = WorkerDiagnosis.cannotRun(spec.copy(pythonExec = exec), e)
    assert(told("python3.99-nowhere").contains("no program 'python3.99-nowhere' on this JVM's PATH"))
    assert(told("/nonexistent/bin/python").contains("'/nonexistent/bin/python' does not exist on this host"))
    val dir = Files.createTempDirectory("pystatestore-python-dir").toFile
    assert(told(dir.getPath).contains("is a directory, not a Python interpreter"))
    val plain = Files.createTempFile("pystatestore-python", "").toFile // mode 0600: not executable, even by root
    assert(told(plain.getPath).contains("is not executable by this user"))
    assert(told(plain.getPath).contains("set by spark.pyspark.python is unusable"))
  }
}
