package org.pystatestore

import java.io.{File, IOException}
import java.nio.charset.StandardCharsets
import java.nio.file.{Files, LinkOption, Path}
import java.nio.file.attribute.{FileTime, PosixFilePermissions, UserPrincipal}

import org.scalatest.funsuite.AnyFunSuite

/**
 * The JVM's work root (WorkRoot.scala) on a real file system: owner-only, never something planted
 * in its place, and the sweep of roots left by gone JVMs takes only those. tests/test_security.py
 * checks the same in a fresh JVM through the shim's jar; here each refusal is a case of its own.
 */
class WorkRootSuite extends AnyFunSuite {
  private val NoFollow = LinkOption.NOFOLLOW_LINKS
  private val pid = ProcessHandle.current().pid()
  /** Above any Linux pid_max (at most 2^22): never a live process. */
  private val GonePid = 99999999L
  private val TwoHoursAgo = FileTime.fromMillis(System.currentTimeMillis() - 2 * 3600 * 1000L)

  private def newBase(): File = Files.createTempDirectory("pystatestore-workroot-test").toFile
  private def mode(f: File): String = PosixFilePermissions.toString(Files.getPosixFilePermissions(f.toPath, NoFollow))
  private def chmod(f: File, m: String): Path =
    Files.setPosixFilePermissions(f.toPath, PosixFilePermissions.fromString(m))
  private def me(base: File): UserPrincipal = Files.getOwner(base.toPath, NoFollow)
  /** Another user, where this process may give a file away (only root may; elsewhere those cases are left out). */
  private val otherUser: Option[UserPrincipal] = if (System.getProperty("user.name") != "root") None
    else Some(java.nio.file.FileSystems.getDefault.getUserPrincipalLookupService.lookupPrincipalByName("nobody"))

  private def refusal(root: WorkRoot): String = intercept[IOException](root.verified()).getMessage

  test("a root is a directory of this user with mode 0700, named for this JVM, new each time") {
    val base = newBase()
    val (a, b) = (WorkRoot.create(base), WorkRoot.create(base))
    for (r <- Seq(a, b)) {
      assert(r.dir.getParentFile == base && r.dir.getName.matches(s"pystatestore-$pid-\\d+"), r.dir.getName)
      assert(mode(r.dir) == "rwx------" && Files.getOwner(r.dir.toPath, NoFollow) == me(base))
      assert(r.verified() == r.dir)
    }
    assert(a.dir != b.dir, "two roots under one name")
    val notADirectory = Files.createTempFile("pystatestore-workroot-file", "").toFile
    val e = intercept[IOException](WorkRoot.create(new File(notADirectory, "local")))
    assert(e.getMessage.contains(s"could not make its owner-only work directory in $notADirectory/local") &&
      e.getMessage.contains("Set spark.local.dir"), e.getMessage)
  }

  test("a root removed under the JVM is made again, owner-only; one changed under it is refused, naming it") {
    val root = WorkRoot.create(newBase())
    WorkRoot.deleteRecursively(root.dir)
    assert(root.verified().isDirectory && mode(root.dir) == "rwx------", "a root a temp cleaner removed")

    chmod(root.dir, "rwxr-xr-x")
    val loose = refusal(root)
    assert(loose.contains(s"${root.dir}") && loose.contains("its mode is rwxr-xr-x") &&
      loose.contains("restart this JVM"), loose)
    chmod(root.dir, "rwx------")

    val elsewhere = Files.createTempDirectory("pystatestore-workroot-elsewhere")
    chmod(elsewhere.toFile, "rwx------")
    Files.delete(root.dir.toPath)
    Files.createSymbolicLink(root.dir.toPath, elsewhere)
    assert(refusal(root).contains("it is a symbolic link"))
    Files.delete(root.dir.toPath)

    Files.write(root.dir.toPath, "planted".getBytes(StandardCharsets.UTF_8))
    assert(refusal(root).contains("it is not a directory"))
    Files.delete(root.dir.toPath)

    assert(root.verified().isDirectory)
    otherUser.foreach { user =>
      Files.setOwner(root.dir.toPath, user)
      assert(refusal(root).contains(s"it belongs to ${user.getName}"))
    }
  }

  test("a worker log is created new and owner-only; a name someone else took is never opened") {
    val root = WorkRoot.create(newBase())
    val log = root.newLog(1)
    assert(log.getParentFile == root.dir && log.getName == "worker-1.log" && mode(log) == "rw-------")
    assert(intercept[IOException](root.newLog(1)).getMessage.contains("could not create the worker log"))
    val target = Files.createTempFile("pystatestore-workroot-target", ".txt")
    Files.write(target, "theirs".getBytes(StandardCharsets.UTF_8))
    Files.createSymbolicLink(root.dir.toPath.resolve("worker-2.log"), target)
    val e = intercept[IOException](root.newLog(2))
    assert(e.getMessage.contains("something other than pystatestore made that name"), e.getMessage)
    assert(new String(Files.readAllBytes(target), StandardCharsets.UTF_8) == "theirs")
  }

  test("the sweep removes only gone JVMs' roots of ours untouched for an hour, never through a link") {
    val base = newBase()
    val outside = Files.createTempDirectory("pystatestore-workroot-outside")
    Files.write(outside.resolve("keep"), Array[Byte](1))
    def root(name: String, m: String = "rwx------", old: Boolean = true): File = {
      val d = new File(base, name)
      Files.createDirectory(d.toPath)
      Files.write(d.toPath.resolve("worker-1.log"), Array[Byte](1))
      Files.createSymbolicLink(d.toPath.resolve("link-out"), outside) // removed as a link, never followed
      chmod(d, m)
      if (old) Files.setLastModifiedTime(d.toPath, TwoHoursAgo)
      d
    }
    val swept = Seq(root(s"pystatestore-$GonePid"), root(s"pystatestore-$GonePid-1234"))
    val kept = Seq(
      root(s"pystatestore-${GonePid + 1}", old = false), // touched within the hour
      root(s"pystatestore-$pid-77"), // a live JVM's (this one)
      root(s"pystatestore-${GonePid + 2}", m = "rwxr-xr-x"), // not owner-only: not one we made
      root(s"pystatestore-x$GonePid"), // not our name
      root(s"spark-$GonePid"))
    val linked = new File(base, s"pystatestore-${GonePid + 3}")
    Files.createSymbolicLink(linked.toPath, root("elsewhere").toPath)
    val planted = new File(base, s"pystatestore-${GonePid + 4}")
    Files.write(planted.toPath, Array[Byte](1))
    Files.setLastModifiedTime(planted.toPath, TwoHoursAgo)
    val theirs = otherUser.map { user =>
      val d = root(s"pystatestore-${GonePid + 5}")
      Files.setOwner(d.toPath, user)
      Files.setLastModifiedTime(d.toPath, TwoHoursAgo)
      d
    }

    val made = WorkRoot.create(base)
    swept.foreach(d => assert(!Files.exists(d.toPath, NoFollow), s"$d was left"))
    (kept ++ theirs :+ new File(base, "elsewhere"))
      .foreach(d => assert(new File(d, "worker-1.log").exists(), s"$d was swept"))
    assert(Files.isSymbolicLink(linked.toPath) && planted.isFile && made.dir.isDirectory)
    assert(Files.exists(outside.resolve("keep")), "the sweep followed a link out of a root")
  }
}
