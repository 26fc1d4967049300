import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;

import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;

/**
 * scripts/bench_point_reads.py's JVM half: the cost of one point read through Spark's rocksdbjni,
 * for a missing key and for a present one, read as `get` alone and as `keyMayExist` first (what the
 * read views do, decision 0035). A DB of `keys` even keys (10-byte keys, 12-byte values, one
 * compacted file) opened read-only with the views' table options; misses read the odd keys.
 * Prints one line per round: microseconds per read for each of the four cases.
 */
public class PointReadBench {
  static byte[] key(long i) {
    byte[] k = new byte[10];
    k[1] = 1;
    for (int b = 0; b < 8; b++) k[2 + b] = (byte) (i >>> (56 - 8 * b));
    return k;
  }

  static byte[] viaKeyMayExist(RocksDB db, ReadOptions ro, byte[] k) throws Exception {
    return db.keyMayExist(ro, k, null) ? db.get(ro, k) : null;
  }

  public static void main(String[] args) throws Exception {
    int keys = Integer.parseInt(args[0]);
    int rounds = Integer.parseInt(args[1]);
    RocksDB.loadLibrary();
    Path dir = Files.createTempDirectory("point-read-bench");
    try {
      try (Options o = new Options().setCreateIfMissing(true); RocksDB db = RocksDB.open(o, dir.toString())) {
        byte[] value = new byte[12];
        for (long i = 0; i < keys; i++) db.put(key(2 * i), value);
        db.compactRange();
      }
      BlockBasedTableConfig table = new BlockBasedTableConfig()
          .setBlockCache(new LRUCache(32L << 20, -1, false, 0.5))
          .setCacheIndexAndFilterBlocks(true)
          .setCacheIndexAndFilterBlocksWithHighPriority(true)
          .setFilterPolicy(new BloomFilter(10));
      try (Options o = new Options().setTableFormatConfig(table).setMaxOpenFiles(-1);
           RocksDB db = RocksDB.openReadOnly(o, dir.toString());
           ReadOptions ro = new ReadOptions().setVerifyChecksums(true)) {
        for (int round = 0; round < rounds; round++) {
          long found = 0;
          long t0 = System.nanoTime();
          for (long i = 0; i < keys; i++) if (db.get(ro, key(2 * i + 1)) != null) found++;
          long t1 = System.nanoTime();
          for (long i = 0; i < keys; i++) if (viaKeyMayExist(db, ro, key(2 * i + 1)) != null) found++;
          long t2 = System.nanoTime();
          for (long i = 0; i < keys; i++) if (db.get(ro, key(2 * i)) == null) found++;
          long t3 = System.nanoTime();
          for (long i = 0; i < keys; i++) if (viaKeyMayExist(db, ro, key(2 * i)) == null) found++;
          long t4 = System.nanoTime();
          if (found != 0) throw new IllegalStateException("a read returned the wrong answer " + found + " times");
          System.out.printf("ROUND miss_get=%.3f miss_maybe=%.3f hit_get=%.3f hit_maybe=%.3f%n",
              (t1 - t0) / 1e3 / keys, (t2 - t1) / 1e3 / keys, (t3 - t2) / 1e3 / keys, (t4 - t3) / 1e3 / keys);
        }
      }
    } finally {
      try (var paths = Files.walk(dir)) {
        paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
      }
    }
  }
}
