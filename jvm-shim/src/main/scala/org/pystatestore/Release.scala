package org.pystatestore

/** The release this jar belongs to; must equal pystatestore.__version__ (tests/test_packaging.py checks). */
object Release {
  val Version = "0.5.0"
}
