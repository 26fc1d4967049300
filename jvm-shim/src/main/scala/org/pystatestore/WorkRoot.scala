package org.pystatestore

import java.io.{File, IOException}
import java.nio.file.{Files, LinkOption, Path}
import java.nio.file.attribute.{PosixFileAttributes, PosixFilePermissions, UserPrincipal}

import scala.util.control.NonFatal

import org.apache.spark.internal.Logging

/**
 * The JVM's work root: worker logs, Arrow exchange files, local databases and read views, all of
 * which hold the state's rows, so it is owner-only (0700). Its name, `pystatestore-<pid>-<random>`,
 * cannot be predicted, and it is created atomically with its mode: a directory, link or file that
 * someone else made first is never taken for it. Made by `create`, once per JVM (StateWorker);
 * every worker generation of that JVM then uses it.
 */
private[pystatestore] final class WorkRoot private (val dir: File, owner: UserPrincipal) {
  /**
   * The root, checked again before use: still a directory of this user with mode 0700. Re-made in
   * place (atomically, 0700) if a temp cleaner removed it; anything else found there is refused.
   */
  def verified(): File = {
    if (!Files.exists(dir.toPath, LinkOption.NOFOLLOW_LINKS)) {
      try WorkRoot.makeOwnerOnly(Files.createDirectory(dir.toPath, WorkRoot.OwnerOnlyDir))
      catch { case NonFatal(_) => } // made first by someone else: refused just below
    }
    WorkRoot.check(dir.toPath, owner, "This JVM made it owner-only and something has changed it since: " +
      s"restore it (a directory of ${owner.getName}, mode 0700) or restart this JVM, which makes a new one")
    dir
  }

  /**
   * A new, empty log for worker `generation`. Created, never opened if it exists (a link or file
   * there was not made by us), so the ProcessBuilder redirect that appends to it by name reaches
   * this file: it sits in a 0700 directory of ours, where no other user can replace it.
   */
  def newLog(generation: Int): File = {
    val path = verified().toPath.resolve(s"worker-$generation.log")
    try Files.createFile(path, PosixFilePermissions.asFileAttribute(PosixFilePermissions.fromString("rw-------")))
    catch {
      case NonFatal(e) => throw new IOException(
        s"pystatestore could not create the worker log $path ($e). Only this user can write in $dir, " +
          "so something other than pystatestore made that name: remove it and run again.", e)
    }
    path.toFile
  }
}

private[pystatestore] object WorkRoot extends Logging {
  private val OwnerOnly = PosixFilePermissions.fromString("rwx------")
  private val OwnerOnlyDir = PosixFilePermissions.asFileAttribute(OwnerOnly)
  /** A root of ours (`pystatestore-<pid>` was an earlier release's), with the pid of its JVM. */
  private val RootName = "^pystatestore-(\\d{1,18})(?:-\\d+)?$".r
  private val StaleAfterMs = 3600L * 1000

  private val WhatToDo = "Set spark.local.dir (or java.io.tmpdir, where Spark sets none) to a directory " +
    "this user can write in, on a file system that keeps POSIX owners and modes"

  /**
   * Makes this JVM's root in `base` (spark.local.dir, else java.io.tmpdir), then sweeps the roots
   * of JVMs that are gone. Fails, naming the directory and what to do, if it cannot be owner-only.
   */
  def create(base: File): WorkRoot = {
    val prefix = s"pystatestore-${ProcessHandle.current().pid()}-"
    val path = try {
      Files.createDirectories(base.toPath)
      Files.createTempDirectory(base.toPath, prefix, OwnerOnlyDir)
    } catch {
      case NonFatal(e) => throw new IOException(
        s"pystatestore could not make its owner-only work directory in $base ($e). $WhatToDo.", e)
    }
    makeOwnerOnly(path)
    // Created just now by this process: its owner is this user, the one every later check expects.
    val owner = Files.getOwner(path, LinkOption.NOFOLLOW_LINKS)
    check(path, owner, WhatToDo)
    sweepLeftovers(base, owner)
    new WorkRoot(path.toFile, owner)
  }

  /** mkdir applies the umask, which may take the owner's own bits: the mode is set outright. */
  private def makeOwnerOnly(path: Path): Path = {
    try Files.setPosixFilePermissions(path, OwnerOnly) catch {
      case NonFatal(e) => throw new IOException(
        s"pystatestore could not make its work directory $path owner-only (mode 0700): $e. $WhatToDo.", e)
    }
    path
  }

  /** Refuses `path` unless it is a directory (not a link) of `owner` with mode 0700. */
  private def check(path: Path, owner: UserPrincipal, whatToDo: String): Unit = {
    val problem = try {
      val attrs = Files.readAttributes(path, classOf[PosixFileAttributes], LinkOption.NOFOLLOW_LINKS)
      unlessOwnerOnly(attrs, owner)
    } catch { case NonFatal(e) => Some(s"it cannot be checked ($e)") }
    problem.foreach { p =>
      throw new IOException(s"pystatestore's work directory $path is not a directory of this user with mode " +
        s"0700: $p. It holds the state's rows; pystatestore will not use it. $whatToDo.")
    }
  }

  private def unlessOwnerOnly(attrs: PosixFileAttributes, owner: UserPrincipal): Option[String] =
    if (attrs.isSymbolicLink) Some("it is a symbolic link")
    else if (!attrs.isDirectory) Some("it is not a directory")
    else if (attrs.owner != owner) Some(s"it belongs to ${attrs.owner.getName}, not ${owner.getName}")
    else if (attrs.permissions != OwnerOnly) Some(s"its mode is ${PosixFilePermissions.toString(attrs.permissions)}")
    else None

  /**
   * Removes the roots of JVMs that are gone (killed before their shutdown hook ran) and that nobody
   * touched for an hour. Only what is exactly a root of ours is considered: named like one, a
   * directory (never a link's target) of this user with mode 0700.
   */
  private def sweepLeftovers(base: File, owner: UserPrincipal): Unit = {
    val now = System.currentTimeMillis()
    Option(base.listFiles()).getOrElse(Array.empty[File]).foreach { d =>
      try d.getName match {
        case RootName(pid) if !ProcessHandle.of(pid.toLong).isPresent =>
          val attrs = Files.readAttributes(d.toPath, classOf[PosixFileAttributes], LinkOption.NOFOLLOW_LINKS)
          if (unlessOwnerOnly(attrs, owner).isEmpty && now - attrs.lastModifiedTime.toMillis > StaleAfterMs) {
            deleteRecursively(d)
          }
        case _ =>
      } catch { case NonFatal(e) => logWarning(s"pystatestore: could not sweep the old work directory $d: $e") }
    }
  }

  /** Deletes `f` and what it holds; a symbolic link is removed, never followed. */
  def deleteRecursively(f: File): Unit = {
    if (f.isDirectory && !Files.isSymbolicLink(f.toPath)) {
      Option(f.listFiles()).foreach(_.foreach(deleteRecursively))
    }
    f.delete()
  }
}
