"""What the benchmarks in scripts/ share, so that each benchmark file holds only its workload and
its verdicts (what it measures and how it judges).

- `providers`: the state store providers the benchmarks compare and the confs each runs with;
- `session`: a child's SparkSession (the driver JVM of one provider's query), its queries to the
  noop sink, a record of its progress; `progress`: a batch's figures from its progress report;
- `child`: running a child process (its own driver JVM) with samplers on it, a timeout that ends
  its whole process tree, and its output;
- `procfs`: a process tree and its figures from /proc (RSS, PSS, descriptors, threads, CPU ticks);
- `samplers`: threads that sample them while a child runs (peak memory, the machine's load);
- `jvm`: what a driver JVM tells of itself (its heap's resident part, its GC log);
- `repeats`: the order providers run in across repeats, and medians with their ranges;
- `report`: the header lines every output carries besides its own (the code, the machine's load), and
  writing the output;
- `build`: scripts/build_jar.py, loaded by path (another Spark minor's pyspark, compiled jars);
- `inputs`: input files the file source reads in order;
- `queries` and `query`: bench.py's streaming queries, and one of them run in a JVM of its own
  (bench.py, bench_restore.py and profile_batches.py run them).

A script finds the package because Python puts the script's directory, scripts/, first on sys.path;
a child started with `-m benchlib.query` gets scripts/ on PYTHONPATH from `child.with_scripts_path`.
"""

from __future__ import annotations

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent.parent
ROOT = SCRIPTS.parent
