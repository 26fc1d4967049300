"""The `pystatestore` command and the API under it, on checkpoints of real queries: `read` equals
`spark.read.format("statestore")` row for row (nested, null, decimal, date, timestamp, binary, map
and array values included), `--key` finds the row Spark's reader shows, `verify` passes healthy
checkpoints and names each kind of damage, `gc --dry-run` lists what maintenance deletes, and all of
it works on a checkpoint served by a local S3 server."""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from pystatestore.reading.checkpoint import open_checkpoint
from pystatestore.reading.decoded import python_rows
from pystatestore.reading.key_lookup import num_partitions
from pystatestore.reading.spark_hash import hash_value, partition_of, stored_key_hashes
from pystatestore.reading.store_reader import StoreReader
from pystatestore.reading.unsafe_row import StateRowDecoder, encode_row, parse_schema, unique_names
from pystatestore.tools.cli import main
from pystatestore.tools.cli_read_only import json_value
from pystatestore.tools.inspection import disk_usage
from pystatestore.tools.state_rows import read_state
from pystatestore.tools.verification import gc_dry_run, verify_checkpoint
from queries import dedup, pandas_sessions
from s3_support import local_s3
from spark_support import OUR_PROVIDER, run_phase, start_session, write_input_files

pytestmark = pytest.mark.spark
CONF = "spark.sql.streaming.stateStore.pystatestore."


def typed_aggregation(df: DataFrame) -> DataFrame:
    """State keys and values of many types: strings, dates, booleans; long decimals (sum of a
    decimal(24,3)), timestamps, shorts, floats, binary, and `first` of a nested struct with nulls,
    an array with a null element and a map."""
    nested = F.struct(
        F.col("id").alias("id"),
        F.when(F.col("value") > 50, F.col("key")).alias("maybe"),
        F.array(F.col("value"), F.lit(None).cast("long")).alias("arr"),
        F.struct(F.to_date("ts").alias("d"), F.lit(None).cast("double").alias("nothing")).alias("inner"),
    )
    return (
        df.withColumn("even", F.col("value") % 2 == 0)
        .groupBy("key", F.to_date("ts").alias("day"), "even")
        .agg(
            F.count("*").alias("n"),
            F.sum((F.col("value") * 1000003).cast("decimal(24,3)")).alias("big"),
            F.avg("value").alias("mean"),
            F.max("ts").alias("last_ts"),
            F.min(F.col("value").cast("short")).alias("small"),
            F.first(F.col("value").cast("float")).alias("f"),
            F.max(F.col("key").cast("binary")).alias("bin"),
            F.first(nested).alias("nested"),
            F.first(F.create_map(F.col("key"), F.col("value").cast("double"))).alias("m"),
            F.first(F.lit(None).cast("string")).alias("always_null"),
        )
    )


def many_key_types(df: DataFrame) -> DataFrame:
    """Grouping keys of every type a point lookup encodes and hashes: a window struct of
    timestamps, bytes, long and short decimals (negative too), doubles, floats, non-ASCII
    strings, binary, timestamp_ntz, longs and a sometimes-null string."""
    return df.groupBy(
        F.window("ts", "20 seconds").alias("w"),
        (F.col("value") % 3 - 1).cast("byte").alias("b"),
        ((F.col("value") % 5) - 2.5).cast("decimal(22,3)").alias("big"),
        (F.col("value") % 4 / 4).cast("decimal(6,2)").alias("small"),
        ((F.col("value") % 3 - 1) * 0.5).alias("d"),
        (F.col("value") % 2 + 0.25).cast("float").alias("f"),
        F.concat(F.col("key"), F.lit("é✓")).alias("s"),
        F.col("key").cast("binary").alias("bin"),
        F.col("ts").cast("timestamp_ntz").alias("ntz"),
        (F.col("id") % 7 - 3).alias("l"),
        F.when(F.col("value") > 80, F.col("key")).alias("maybe"),
    ).agg(F.count("*").alias("n"))


QUERIES = {
    "typed": (typed_aggregation, "update", "changelog"),
    "keys": (many_key_types, "update", "snapshot"),
    "dedup": (dedup, "append", "snapshot"),
    "pandas": (pandas_sessions, "update", "changelog"),
}


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = start_session(
        "local[2]",
        **{"spark.sql.session.timeZone": "UTC", "spark.sql.streaming.minBatchesToRetain": "3"},
    )
    yield session
    session.stop()


@pytest.fixture(scope="module")
def checkpoints(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One checkpoint per query, written by our provider over 5 input files (5 batches)."""
    base = tmp_path_factory.mktemp("cli")
    out = {}
    for name, (build, mode, commit_mode) in QUERIES.items():
        spark.conf.set(CONF + "commitMode", commit_mode)
        # one query with another partition count: lookups must take it from the checkpoint
        spark.conf.set("spark.sql.shuffle.partitions", "7" if name == "keys" else "3")
        input_dir, ckpt = base / f"in-{name}", base / f"ckpt-{name}"
        write_input_files(input_dir, 0, 5)
        run_phase(
            spark, build, provider=OUR_PROVIDER, input_dir=input_dir, checkpoint=ckpt, output_mode=mode, results={}
        )
        out[name] = ckpt
    spark.conf.unset(CONF + "commitMode")
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    return out


def normal(v: Any) -> Any:
    """One form for what Spark's collect() and Arrow give: timestamps in UTC, binary as bytes."""
    if isinstance(v, Row):  # Spark's struct values, named as python_rows names them (sum, sum#2)
        return {n: normal(x) for n, x in zip(unique_names(v.__fields__), v, strict=True)}
    if isinstance(v, dict):
        return {k: normal(x) for k, x in v.items()}
    if isinstance(v, list) and v and all(isinstance(x, tuple) for x in v):  # a map, as pairs
        return {normal(k): normal(x) for k, x in v}
    if isinstance(v, list):
        return [normal(x) for x in v]
    if isinstance(v, dt.datetime):
        aware = v if v.tzinfo is not None else v.astimezone()
        return aware.astimezone(dt.timezone.utc)
    if isinstance(v, (bytes, bytearray)):
        return bytes(v)
    if isinstance(v, decimal.Decimal):
        return v.normalize()
    return v


def spark_rows(spark: SparkSession, ckpt: Path, **options: Any) -> list[tuple]:
    reader = spark.read.format("statestore")
    for k, v in options.items():
        reader = reader.option(k, v)
    out = []
    for r in reader.load(str(ckpt)).select("key", "value", "partition_id").collect():
        out.append((normal(r["key"]), normal(r["value"]), r["partition_id"]))
    return sorted(out, key=repr)


def our_rows(ckpt: Path, **kwargs: Any) -> list[tuple]:
    table = read_state(open_checkpoint(str(ckpt)), **kwargs)
    rows = python_rows(table)
    return sorted(((normal(r["key"]), normal(r["value"]), r["partition_id"]) for r in rows), key=repr)


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_read_equals_sparks_state_reader(spark: SparkSession, checkpoints: dict[str, Path], query: str) -> None:
    ckpt = checkpoints[query]
    theirs = spark_rows(spark, ckpt)
    ours = our_rows(ckpt)
    assert theirs, "the query left no state to compare"
    assert ours == theirs
    if query == "typed":  # the rows hold what the test means to cover (buffers: first#2 is `nested`)
        values = [v for _, v, _ in ours]
        assert any(v["first#2"]["maybe"] is None for v in values) and any(v["first#2"]["maybe"] for v in values)
        assert all(v["first#4"] is None and v["first#2"]["arr"][1] is None for v in values)
        assert all(isinstance(v["sum"], decimal.Decimal) and v["first#3"] for v in values)


def test_read_an_earlier_batch_and_one_partition(spark: SparkSession, checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["typed"]
    theirs = [r for r in spark_rows(spark, ckpt, batchId=2) if r[2] == 1]
    assert theirs
    assert our_rows(ckpt, batch=2, partitions=[1]) == theirs


def test_key_lookup_finds_the_row_sparks_reader_shows(spark: SparkSession, checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["pandas"]
    theirs = spark_rows(spark, ckpt)
    key, value, partition = theirs[len(theirs) // 2]
    done = CliRunner().invoke(main, ["read", str(ckpt), "--key", json.dumps(key), "-o", "-"])
    assert done.exit_code == 0, done.output
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == [{"key": key, "value": value, "partition_id": partition}]
    none = CliRunner().invoke(main, ["read", str(ckpt), "--key", json.dumps({"key": "no-such-key"}), "-o", "-"])
    assert none.exit_code == 0 and none.stdout == ""


@pytest.mark.parametrize("query", sorted(QUERIES))
def test_stored_keys_encode_and_hash_as_spark_wrote_them(checkpoints: dict[str, Path], query: str) -> None:
    """Every key Spark stored re-encodes to the very same bytes, and Spark's hash partitioning sends
    it to the partition that holds it: what a point lookup relies on."""
    ckpt = open_checkpoint(str(checkpoints[query]))
    version = ckpt.version_of_batch(None)
    n = num_partitions(ckpt, ckpt.stores_of(0))
    assert n == (7 if query == "keys" else 3)
    checked = 0
    for loc in ckpt.stores_of(0):
        with StoreReader(loc) as reader:
            decoder = StateRowDecoder(*reader.schemas(version))
            for stored, _ in reader.pairs(version):
                key = decoder.key(stored)
                assert encode_row(decoder.key_type, key) == stored, key
                assert partition_of(decoder.key_type, key, n) == loc.partition_id, key
                checked += 1
    assert checked >= 10


def as_json(key: Any) -> dict[str, Any]:
    """A key as `read -o -` prints it, which --key takes."""
    return json.loads(json.dumps(key, default=json_value))


def test_a_whole_key_is_looked_up_in_its_partition_alone(spark: SparkSession, checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["keys"]
    theirs = spark_rows(spark, ckpt)
    picks = theirs[:: max(1, len(theirs) // 6)]
    notes: list[str] = []
    ours = our_rows(ckpt, keys=[as_json(k) for k, _, _ in picks], notice=notes.append)
    assert ours == sorted(picks, key=repr)
    partitions = {p for _, _, p in picks}
    assert notes == [
        f"looked up {len(picks)} key(s) in {len(partitions)} of 7 partitions "
        "(the ones Spark's hash partitioning sends them to)"
    ]
    # a key that is not in the state: looked up, nothing found
    # Spark names grouping expressions _groupingexpression, #2, ...: window, b, big, small, d, f, s, bin, ntz, l, maybe
    names = list(picks[0][0])
    assert len(names) == 11 and names[0] == "window"
    missing = as_json({**picks[0][0], names[9]: 1000})
    assert our_rows(ckpt, keys=[missing], notice=notes.append) == [] and notes[-1].startswith("looked up 1 key")
    # keys naming some columns only are scanned for
    some = {names[6]: picks[0][0][names[6]], names[10]: None}
    assert our_rows(ckpt, keys=[some], notice=notes.append) == [
        r for r in theirs if r[0][names[6]] == some[names[6]] and r[0][names[10]] is None
    ]
    assert notes[-1].startswith(
        "scanning every partition for the key: a key must name every key column (window, _grouping"
    )
    # on the command line: the note on stderr, the rows on stdout
    done = CliRunner().invoke(main, ["read", str(ckpt), "--key", json.dumps(as_json(picks[0][0])), "-o", "-"])
    assert done.exit_code == 0, done.output
    assert len(done.stdout.splitlines()) == 1 and "looked up 1 key(s) in 1 of 7 partitions" in done.stderr


def test_a_key_value_of_the_wrong_type_is_named(checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["keys"]
    row = python_rows(read_state(open_checkpoint(str(ckpt)), partitions=[0]))[0]
    bad = {**as_json(row["key"]), "_groupingexpression": "one"}
    done = CliRunner().invoke(main, ["read", str(ckpt), "--key", json.dumps(bad), "-o", "-"])
    assert done.exit_code == 1 and done.stdout == ""
    assert (
        "key column '_groupingexpression' is byte; 'one' is not one" in done.stderr
        and "Give the key as `read -o -`" in done.stderr
    )


def test_partition_hash_equals_sparks_hash(spark: SparkSession) -> None:
    """spark_hash against Spark's own hash() (Murmur3, seed 42) on values of every hashed type,
    edge values included: -0.0 and NaN, extremes, empty and non-ASCII strings of every length
    mod 4, negative long decimals, nulls, a nested struct."""
    import random

    from pyspark.sql import types as T

    rnd = random.Random(5)
    utc = dt.timezone.utc
    schema = T.StructType(
        [
            T.StructField("bool", T.BooleanType()),
            T.StructField("byte", T.ByteType()),
            T.StructField("short", T.ShortType()),
            T.StructField("int", T.IntegerType()),
            T.StructField("long", T.LongType()),
            T.StructField("float", T.FloatType()),
            T.StructField("double", T.DoubleType()),
            T.StructField("small", T.DecimalType(6, 2)),
            T.StructField("big", T.DecimalType(30, 5)),
            T.StructField("str", T.StringType()),
            T.StructField("bin", T.BinaryType()),
            T.StructField("date", T.DateType()),
            T.StructField("ts", T.TimestampType()),
            T.StructField("ntz", T.TimestampNTZType()),
            T.StructField(
                "nested", T.StructType([T.StructField("a", T.IntegerType()), T.StructField("b", T.StringType())])
            ),
        ]
    )
    floats = [0.0, -0.0, float("nan"), 1.5, -3.25, 1e30, float("inf")]
    text = ["", "a", "ab", "abc", "abcd", "abcde", "é", "✓✓", "日本語テキスト", "k12"]
    rows = []
    for i in range(120):
        rows.append(
            (
                rnd.choice([True, False, None]),
                rnd.choice([-128, 127, 0, rnd.randrange(-100, 100)]),
                rnd.randrange(-32768, 32768),
                rnd.choice([-(2**31), 2**31 - 1, rnd.randrange(-(10**6), 10**6)]),
                rnd.choice([-(2**63), 2**63 - 1, rnd.randrange(-(10**12), 10**12)]),
                rnd.choice(floats),
                rnd.choice(floats + [rnd.uniform(-1e6, 1e6)]),
                decimal.Decimal(rnd.randrange(-99999, 99999)).scaleb(-2),
                rnd.choice([None, decimal.Decimal(rnd.randrange(-(10**24), 10**24)).scaleb(-5)]),
                rnd.choice(text + [None]),
                rnd.choice([b"", b"\x00\xff\x80", bytes(range(i % 11)), None]),
                dt.date(1969, 12, 31) + dt.timedelta(days=rnd.randrange(-5000, 30000)),
                dt.datetime(1960, 1, 1, tzinfo=utc) + dt.timedelta(microseconds=rnd.randrange(10**16)),
                dt.datetime(1960, 1, 1) + dt.timedelta(microseconds=rnd.randrange(10**16)),
                rnd.choice([None, (rnd.randrange(100), rnd.choice(text + [None]))]),
            )
        )
    df = spark.createDataFrame(rows, schema)
    names = df.columns
    # The column form (stored_key_hashes) reads keys as the encoder writes them; it has no long decimals.
    columns = [n for n in names if n != "big"]
    hashed = df.select(
        F.hash(*names).alias("row"),
        F.hash(*columns).alias("columns"),
        *(F.hash(n).alias(f"h_{n}") for n in names),
    ).collect()
    key_type = parse_schema(schema.json())
    for values, spark_hashes in zip(rows, hashed, strict=True):
        for (name, t, _), v in zip(key_type.fields, values, strict=True):
            assert hash_value(t, v, 42) == spark_hashes[f"h_{name}"], (name, v)
        assert hash_value(key_type, values, 42) == spark_hashes["row"]
    # Many stored keys at once: each column alone, and all but the nested struct folded (the
    # nested struct goes key by key), from UnsafeRow bytes, raw and after a prefix row.
    at = {n: i for i, n in enumerate(names)}
    for name in columns:
        one = parse_schema(T.StructType([schema[name]]).json())
        keys = pa.array([encode_row(one, (r[at[name]],)) for r in rows], pa.binary())
        got = stored_key_hashes(one, keys, "raw", 1).tolist()
        assert got == [h[f"h_{name}"] for h in hashed], name
    folded = parse_schema(T.StructType([schema[n] for n in columns]).json())
    raw = [encode_row(folded, tuple(r[at[n]] for n in columns)) for r in rows]
    prefixed = pa.array([(3).to_bytes(4, "big") + b"pfx" + k for k in raw], pa.binary())
    for keys, encoding in ((pa.array(raw, pa.binary()), "raw"), (prefixed, "prefix-v1")):
        for fields in (len(columns), len(columns) - 1):
            want = [h["columns"] for h in hashed] if fields == len(columns) else None
            got = stored_key_hashes(folded, keys, encoding, fields).tolist()
            if want is not None:
                assert got == want, encoding
            else:  # all but the nested struct: every step a column operation
                spark_prefix = df.select(F.hash(*columns[:-1]).alias("h")).collect()
                assert got == [h["h"] for h in spark_prefix], encoding


@pytest.mark.parametrize("query", ["typed", "dedup", "keys"])
def test_reading_reports_every_byte_each_restore_downloads(checkpoints: dict[str, Path], query: str) -> None:
    ckpt = open_checkpoint(str(checkpoints[query]))
    version = ckpt.version_of_batch(None)
    heard: list[tuple[str, int, int]] = []
    read_state(ckpt, progress=lambda what, done, total: heard.append((what, done, total)))
    downloads = [(done, total) for what, done, total in heard if what == "downloading"]
    expected = []
    for location in ckpt.stores:
        with StoreReader(location) as reader:
            expected.append(reader.restore_bytes(version))
    if query == "typed":  # small changelog commits: every file inline in the manifests, no bar
        assert not any(expected) and not downloads
        return
    # per store with files: (0, total) when it starts, the running count after each chunk, then done
    starts = [i for i, (done, _) in enumerate(downloads) if done == 0]
    assert len(starts) == len([e for e in expected if e]) > 0
    for size, start, end in zip([e for e in expected if e], starts, [*starts[1:], len(downloads)], strict=True):
        events = downloads[start:end]
        assert all(total == size for _, total in events)
        counts = [done for done, _ in events[1:-1]]
        assert counts == sorted(counts) and counts[-1] == size, events


def test_read_writes_parquet_and_csv(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = checkpoints["typed"]
    runner = CliRunner()
    assert runner.invoke(main, ["read", str(ckpt), "-o", str(tmp_path / "s.parquet")]).exit_code == 0
    table = pq.read_table(tmp_path / "s.parquet")
    assert table.column_names == ["key", "value", "partition_id"]
    assert table.equals(read_state(open_checkpoint(str(ckpt))))
    done = runner.invoke(main, ["read", str(ckpt), "-o", str(tmp_path / "s.csv")])
    assert done.exit_code == 0, done.output
    header = (tmp_path / "s.csv").read_text().splitlines()[0]
    assert '"key.key"' in header and '"value.first#2.inner.d"' in header and '"value.first#3"' in header


def test_inspect_shows_the_metadata_tree(checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["typed"]
    done = CliRunner().invoke(main, ["inspect", str(ckpt), "--json"])
    assert done.exit_code == 0, done.output
    tree = json.loads(done.output)
    assert tree["batch"] == 4 and tree["version"] == 5
    stores = [s for op in tree["operators"] for p in op["partitions"] for s in p["stores"]]
    assert len(stores) == 3 and all(s["manifest"]["kind"] == "changelog" for s in stores)
    # durable first (the default), the commit's own steps are the segment and the upload
    assert all(s["manifest"]["commit_ms"].keys() >= {"segmentMs", "uploadMs"} for s in stores)
    assert sum(s["manifest"]["num_keys"] for s in stores) == len(read_state(open_checkpoint(str(ckpt))))
    table = CliRunner().invoke(main, ["inspect", str(ckpt), "--batch", "1"])
    assert table.exit_code == 0 and "batch 1 is state version 2" in table.output
    missing = CliRunner().invoke(main, ["inspect", str(ckpt), "--batch", "99"])
    assert missing.exit_code == 1 and "batch 99 is not in the commit log" in missing.output


def damage(ckpt: Path, how: str) -> str:
    """Damages one file of partition 0's store of `ckpt` the way `how` says; returns its path."""
    store = ckpt / "state" / "0" / "0"
    last = max((store / "manifests").glob("*.json"), key=lambda p: int(p.stem))
    if how in ("missing", "truncated", "flipped"):
        doc = json.loads(last.read_text())
        victim = store / sorted(r["path"] for r in doc["shared"].values() if "path" in r)[0]
        if how == "missing":
            victim.unlink()
        elif how == "truncated":
            victim.write_bytes(victim.read_bytes()[:-7])
        else:
            data = bytearray(victim.read_bytes())
            data[len(data) // 2] ^= 0x10
            victim.write_bytes(bytes(data))
        return str(victim.relative_to(store))
    if how == "bad-manifest":
        last.write_text(last.read_text()[:-20])
    else:  # tampered path: a shared file's path points outside the store
        doc = json.loads(last.read_text())
        name = next(iter(n for n, r in doc["shared"].items() if "path" in r))
        doc["shared"][name]["path"] = "../../../../etc/passwd"
        last.write_text(json.dumps(doc))
    return str(last.relative_to(store))


@pytest.mark.parametrize("how", ["missing", "truncated", "flipped", "bad-manifest", "tampered-path"])
def test_verify_names_each_kind_of_damage(checkpoints: dict[str, Path], tmp_path: Path, how: str) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["dedup"], ckpt)  # snapshot commits: every version lists its files
    healthy = CliRunner().invoke(main, ["verify", str(ckpt), "--deep"])
    assert healthy.exit_code == 0 and "the checkpoint can be restored" in healthy.output, healthy.output
    victim = damage(ckpt, how)
    args = ["verify", str(ckpt), "--json"] + (["--deep"] if how == "flipped" else [])
    done = CliRunner().invoke(main, args)
    assert done.exit_code == 1, done.output
    report = json.loads(done.output)
    assert not report["restorable"]
    assert any(victim in (p["file"] or "") and p["store"].endswith("state/0/0") for p in report["problems"]), report
    if how == "flipped":  # without --deep, sizes match: only the checksum tells
        assert CliRunner().invoke(main, ["verify", str(ckpt)]).exit_code == 0


@pytest.mark.parametrize("how", ["inline-data", "chain-manifest"])
def test_verify_walks_changelog_chains_and_reads_data_stored_inside(
    checkpoints: dict[str, Path], tmp_path: Path, how: str
) -> None:
    """A changelog checkpoint: every retained version restores through the chain back to version 1,
    and small changes are stored inside the manifests. Corrupted inline data (valid base64, wrong
    bytes) fails `--deep`, naming the manifest; a missing chain manifest fails any verify."""
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["typed"], ckpt)  # changelog commits, changes inline
    healthy = CliRunner().invoke(main, ["verify", str(ckpt), "--deep"])
    assert healthy.exit_code == 0 and "the checkpoint can be restored" in healthy.output, healthy.output
    store = ckpt / "state" / "0" / "0"
    victim = store / "manifests" / "2.json"
    doc = json.loads(victim.read_text())
    assert doc["kind"] == "changelog" and "data" in doc["changes"], doc
    if how == "inline-data":
        data = bytearray(base64.b64decode(doc["changes"]["data"]))
        data[len(data) // 2] ^= 0x10
        doc["changes"]["data"] = base64.b64encode(bytes(data)).decode()
        victim.write_text(json.dumps(doc))
    else:
        victim.unlink()
    done = CliRunner().invoke(main, ["verify", str(ckpt), "--json", "--deep"])
    assert done.exit_code == 1, done.output
    problems = json.loads(done.output)["problems"]
    assert any(p["file"] == "manifests/2.json" and p["store"].endswith("state/0/0") for p in problems), problems


def test_verify_lists_unreferenced_files(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["dedup"], ckpt)
    stray = ckpt / "state" / "0" / "1" / "shared" / "0123456789abcdef0123456789abcdef-000999.sst"
    stray.write_bytes(b"x" * 10)
    report = verify_checkpoint(open_checkpoint(str(ckpt)), grace_seconds=3600)
    assert report.restorable and report.young_unreferenced == [f"file:{stray}"] and report.unreferenced == []
    old = time.time() - 7200
    os.utime(stray, (old, old))
    report = verify_checkpoint(open_checkpoint(str(ckpt)), grace_seconds=3600)
    assert report.unreferenced == [f"file:{stray}"]


def test_gc_dry_run_lists_exactly_what_maintenance_deletes(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(checkpoints["dedup"], ckpt)
    before = {p for p in ckpt.rglob("*") if p.is_file()}
    now = time.time() + 3600  # past the grace: unreferenced files go too
    planned = gc_dry_run(open_checkpoint(str(ckpt)), min_batches_to_retain=2, grace_seconds=600, now=now)
    assert {p for p in ckpt.rglob("*") if p.is_file()} == before, "a dry run deleted something"
    assert planned, "nothing to collect: the test would prove nothing"
    for location in open_checkpoint(str(ckpt)).stores:  # what a worker's maintenance does to each
        with StoreReader(location, retain=2, grace_seconds=600) as reader:
            reader.backend.maintenance(now=now)
    deleted = {str(p) for p in before if not p.exists()}
    assert deleted == {f"{d.store.removeprefix('file:')}/{d.path}" for d in planned}
    shown = CliRunner().invoke(main, ["gc", str(checkpoints["dedup"]), "--dry-run", "--min-batches-to-retain", "2"])
    assert shown.exit_code == 0 and "maintenance would delete" in shown.output


def test_du_counts_every_file_of_every_store(checkpoints: dict[str, Path]) -> None:
    ckpt = checkpoints["typed"]
    done = CliRunner().invoke(main, ["du", str(ckpt), "--json"])
    assert done.exit_code == 0, done.output
    usage = json.loads(done.output)
    on_disk = [p for p in (ckpt / "state").rglob("*") if p.is_file() and "/_" not in str(p.relative_to(ckpt))]
    assert sum(u["total_bytes"] for u in usage) == sum(p.stat().st_size for p in on_disk)


def test_a_checkpoint_that_is_not_one_gets_a_clear_error(tmp_path: Path) -> None:
    done = CliRunner().invoke(main, ["inspect", str(tmp_path)])
    assert done.exit_code == 1 and "not a Spark streaming checkpoint" in done.output
    done = CliRunner().invoke(main, ["verify", str(tmp_path / "nowhere")])
    assert done.exit_code == 1 and "no checkpoint directory" in done.output


@pytest.fixture(scope="module")
def s3_checkpoints(checkpoints: dict[str, Path]) -> Iterator[dict[str, str]]:
    """Two test checkpoints copied into a bucket of a local S3 server (moto's), named by the URIs a
    user of MinIO or another S3 endpoint passes: pyarrow's options in the query, keys in the env."""
    with local_s3() as options:
        s3 = pafs.S3FileSystem(**options, allow_bucket_creation=True)  # type: ignore[arg-type]
        s3.create_dir("ckpts")
        for name in ("typed", "dedup"):
            pafs.copy_files(
                str(checkpoints[name]),
                f"ckpts/{name}",
                source_filesystem=pafs.LocalFileSystem(),
                destination_filesystem=s3,
            )
        yield {name: f"s3://ckpts/{name}?{urlencode(options)}" for name in ("typed", "dedup")}


def test_the_tools_work_on_a_checkpoint_in_s3(checkpoints: dict[str, Path], s3_checkpoints: dict[str, str]) -> None:
    """Everything but the local disk: listing, manifests, restores and checksums through S3."""
    for name, uri in s3_checkpoints.items():
        remote, local = open_checkpoint(uri), open_checkpoint(str(checkpoints[name]))
        assert [(s.operator_id, s.partition_id, s.store_name) for s in remote.stores] == [
            (s.operator_id, s.partition_id, s.store_name) for s in local.stores
        ]
        assert remote.committed_batches == local.committed_batches and remote.conf == local.conf
        assert read_state(remote).equals(read_state(local))
        usage = [[(u.total_bytes, u.files) for u in disk_usage(c)] for c in (remote, local)]
        assert usage[0] == usage[1]
        done = CliRunner().invoke(main, ["verify", uri, "--deep"])
        assert done.exit_code == 0 and "the checkpoint can be restored" in done.output, done.output
    uri = s3_checkpoints["dedup"]
    key = python_rows(read_state(open_checkpoint(uri)))[0]["key"]
    looked_up = CliRunner().invoke(main, ["read", uri, "--key", json.dumps(key, default=json_value), "-o", "-"])
    assert looked_up.exit_code == 0 and "looked up 1 key(s) in 1 of 3 partitions" in looked_up.stderr, looked_up.output
    assert len(looked_up.stdout.splitlines()) == 1
    now = time.time() + 3600
    planned = gc_dry_run(open_checkpoint(uri), min_batches_to_retain=2, now=now)
    expected = gc_dry_run(open_checkpoint(str(checkpoints["dedup"])), min_batches_to_retain=2, now=now)
    assert planned and [(d.store.split("/ckpts/dedup/")[1].split("?")[0], d.path) for d in planned] == [
        (d.store.split("/ckpt-dedup/")[1], d.path) for d in expected
    ]
    store = checkpoints["dedup"] / "state" / "0" / "0"  # the same bytes as the bucket's copy
    last = max((store / "manifests").glob("*.json"), key=lambda p: int(p.stem))
    victim = sorted(r["path"] for r in json.loads(last.read_text())["shared"].values() if "path" in r)[0]
    s3, _ = pafs.FileSystem.from_uri(uri)
    s3.delete_file(f"ckpts/dedup/state/0/0/{victim}")
    damaged = CliRunner().invoke(main, ["verify", uri, "--json"])
    assert damaged.exit_code == 1, damaged.output
    problems = json.loads(damaged.output)["problems"]
    assert any(victim in (p["file"] or "") and "/ckpts/dedup/state/0/0" in p["store"] for p in problems), problems


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """Loads `page` in headless Chromium (Debian's, which setup installs); returns the DOM after
    its scripts ran and the page's console messages."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is missing: scripts/setup.sh installs Debian's chromium package"
    done = subprocess.run(
        [
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=10000",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_the_report_opens_offline_without_console_errors(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    done = CliRunner().invoke(main, ["report", str(checkpoints["typed"]), "-o", str(page)])
    assert done.exit_code == 0, done.output
    text = page.read_text()
    assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']?(https?:)?//", text), "the report loads from the network"
    assert "restorable" in text and "Commit time split" in text
    dom, console = open_in_chromium(page, tmp_path)
    assert console == [], console
    assert dom.count('class="main-svg"') >= 4, "the plots were not drawn"
    # The check can fail: a page whose script throws is caught.
    broken = tmp_path / "broken.html"
    broken.write_text(text.replace("</body>", "<script>undefinedFunction()</script></body>"))
    assert any("undefinedFunction" in line for line in open_in_chromium(broken, tmp_path)[1])
