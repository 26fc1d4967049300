import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Random;

import org.rocksdb.BlockBasedTableConfig;
import org.rocksdb.BloomFilter;
import org.rocksdb.CompactionStyle;
import org.rocksdb.CompressionType;
import org.rocksdb.EnvOptions;
import org.rocksdb.IndexType;
import org.rocksdb.IngestExternalFileOptions;
import org.rocksdb.LRUCache;
import org.rocksdb.Options;
import org.rocksdb.ReadOptions;
import org.rocksdb.RocksDB;
import org.rocksdb.SstFileWriter;

/**
 * scripts/bench_point_reads.py's JVM half: the cost of one point read through Spark's rocksdbjni,
 * for a missing key and for a present one, read as `get` alone and as `keyMayExist` first (what the
 * read views do, decision 0035), against a DB of `runs` sorted runs.
 *
 * The DB is written the way the worker writes a store (config.py): each run is one SST of
 * `keys / runs` keys, written in key order with 10-bit Bloom filters, partitioned index and filters
 * (4 KiB partitions, format 5, LZ4) and ingested, as a commit's changes are; compactions are off, so
 * the DB keeps `runs` runs, as a view does between universal compactions. Run r holds the even keys
 * 2i with i mod runs == r, so every run spans the whole key space (as hashed grouping keys do). It is
 * opened read-only with the views' reader options (ReadViews.scala: a 32 MiB LRU cache, half of it
 * for index and filter blocks). Reads go in a fixed random order: misses read the odd keys.
 * Prints one line per run count and round: microseconds per read for each of the four cases.
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

  /** The worker's table options for the SSTs it writes (config.py db_options). */
  static Options writeOptions() {
    BlockBasedTableConfig table = new BlockBasedTableConfig()
        .setFormatVersion(5)
        .setFilterPolicy(new BloomFilter(10, false))
        .setIndexType(IndexType.kTwoLevelIndexSearch)
        .setPartitionFilters(true)
        .setMetadataBlockSize(4096)
        .setPinTopLevelIndexAndFilter(true);
    return new Options().setCreateIfMissing(true).setTableFormatConfig(table)
        .setCompactionStyle(CompactionStyle.UNIVERSAL).setCompressionType(CompressionType.LZ4_COMPRESSION)
        .setDisableAutoCompactions(true);
  }

  static void build(Path dir, int keys, int runs) throws Exception {
    byte[] value = new byte[12];
    try (Options o = writeOptions(); RocksDB db = RocksDB.open(o, dir.toString())) {
      for (int r = 0; r < runs; r++) {
        Path sst = dir.resolve("run-" + r + ".sst");
        try (EnvOptions env = new EnvOptions(); SstFileWriter w = new SstFileWriter(env, o)) {
          w.open(sst.toString());
          for (long i = r; i < keys; i += runs) w.put(key(2 * i), value);  // ascending: big-endian keys
          w.finish();
        }
        try (IngestExternalFileOptions ingest = new IngestExternalFileOptions().setMoveFiles(true)) {
          db.ingestExternalFile(List.of(sst.toString()), ingest);
        }
      }
      int files = db.getLiveFilesMetaData().size();
      if (files != runs) throw new IllegalStateException("expected " + runs + " files, the DB has " + files);
    }
  }

  static void delete(Path dir) throws Exception {
    try (var paths = Files.walk(dir)) {
      paths.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    }
  }

  public static void main(String[] args) throws Exception {
    int keys = Integer.parseInt(args[0]);
    int rounds = Integer.parseInt(args[1]);
    List<Integer> runCounts = new ArrayList<>();
    for (String r : args[2].split(",")) runCounts.add(Integer.parseInt(r));
    RocksDB.loadLibrary();
    int[] order = new int[keys];  // one fixed random order of the key indexes
    for (int i = 0; i < keys; i++) order[i] = i;
    Random rnd = new Random(42);
    for (int i = keys - 1; i > 0; i--) {
      int j = rnd.nextInt(i + 1);
      int t = order[i]; order[i] = order[j]; order[j] = t;
    }
    for (int runs : runCounts) {
      Path dir = Files.createTempDirectory("point-read-bench");
      try {
        build(dir, keys, runs);
        BlockBasedTableConfig table = new BlockBasedTableConfig()
            .setBlockCache(new LRUCache(32L << 20, -1, false, 0.5))
            .setCacheIndexAndFilterBlocks(true)
            .setCacheIndexAndFilterBlocksWithHighPriority(true)
            .setPinL0FilterAndIndexBlocksInCache(false)
            .setFilterPolicy(new BloomFilter(10, false));
        try (Options o = new Options().setTableFormatConfig(table).setMaxOpenFiles(-1);
             RocksDB db = RocksDB.openReadOnly(o, dir.toString());
             ReadOptions ro = new ReadOptions().setVerifyChecksums(true)) {
          for (int round = 0; round < rounds; round++) {
            long wrong = 0;
            long t0 = System.nanoTime();
            for (int i : order) if (db.get(ro, key(2L * i + 1)) != null) wrong++;
            long t1 = System.nanoTime();
            for (int i : order) if (viaKeyMayExist(db, ro, key(2L * i + 1)) != null) wrong++;
            long t2 = System.nanoTime();
            for (int i : order) if (db.get(ro, key(2L * i)) == null) wrong++;
            long t3 = System.nanoTime();
            for (int i : order) if (viaKeyMayExist(db, ro, key(2L * i)) == null) wrong++;
            long t4 = System.nanoTime();
            if (wrong != 0) throw new IllegalStateException("a read returned the wrong answer " + wrong + " times");
            System.out.printf("ROUND runs=%d miss_get=%.3f miss_maybe=%.3f hit_get=%.3f hit_maybe=%.3f%n", runs,
                (t1 - t0) / 1e3 / keys, (t2 - t1) / 1e3 / keys, (t3 - t2) / 1e3 / keys, (t4 - t3) / 1e3 / keys);
          }
        }
      } finally {
        delete(dir);
      }
    }
  }
}
