"""Queryable state (`StateClient`, `pystatestore serve`) on real queries. The referee is the input:
each batch reads one file the test wrote, so the state after batch b is the count and sum per key of
files 0..b, computed here in plain Python. Every answer must equal that at the batch it names, while
the query runs, restarts, has its state workers killed, snapshots and GCs; the service must never
write into the checkpoint, must fail only the store whose file is damaged, and must keep its
security rules (loopback by default, a token everywhere else)."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from pystatestore.queryable import BatchGoneError, QuestionError, StateClient, versions
from pystatestore.queryable.restorer import remove_discarded
from pystatestore.queryable.server import ServeConfigError, check_binding
from pystatestore.store.errors import StateStoreError
from pystatestore.tools.cli import main
from serve_support import Served, key_param
from spark_support import OUR_PROVIDER, start_session
from test_faults import worker_pids

pytestmark = pytest.mark.spark
CONF = "spark.sql.streaming.stateStore.pystatestore."
KEYS = 60
ROWS_PER_FILE = 150


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    # local[2,4]: a task whose state worker was killed is retried, as on a cluster
    session = start_session(
        "local[2,4]",
        **{
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.streaming.minBatchesToRetain": "3",  # GC deletes versions while the client reads
            "spark.sql.streaming.stateStore.maintenanceInterval": "1s",
            "spark.sql.streaming.stateStore.minDeltasForSnapshot": "2",  # snapshots made as it runs
        },
    )
    yield session
    session.stop()


def write_files(input_dir: Path, first: int, count: int) -> list[list[tuple[str, int]]]:
    """Files of (key, value) rows; returns their rows (the referee's record of the input)."""
    input_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(first, first + count):
        rnd = random.Random(1000 + i)
        rows = [(f"k{rnd.randrange(KEYS)}", rnd.randrange(100)) for _ in range(ROWS_PER_FILE)]
        tmp = input_dir / f".f{i:04d}.tmp"
        tmp.write_text("".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in rows))
        os.utime(tmp, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source orders by mtime
        tmp.rename(input_dir / f"f{i:04d}.json")
        written.append(rows)
    return written


def expected_state(files: list[list[tuple[str, int]]], batch: int) -> dict[str, dict[str, int]]:
    """{key: {"count", "sum"}} after `batch` (files 0..batch), from the input alone."""
    counts: Counter[str] = Counter()
    sums: Counter[str] = Counter()
    for rows in files[: batch + 1]:
        for k, v in rows:
            counts[k] += 1
            sums[k] += v
    return {k: {"count": counts[k], "sum": sums[k]} for k in counts}


def start_query(spark: SparkSession, input_dir: Path, ckpt: Path) -> StreamingQuery:
    spark.conf.set("spark.sql.streaming.stateStore.providerClass", OUR_PROVIDER)
    source = spark.readStream.schema("key string, value long").option("maxFilesPerTrigger", 1).json(str(input_dir))
    counted = source.groupBy("key").agg(F.count("*").alias("count"), F.sum("value").alias("sum"))
    return (
        counted.writeStream.outputMode("update")
        .format("noop")
        .option("checkpointLocation", str(ckpt))
        .trigger(processingTime="300 milliseconds")
        .start()
    )


def committed(ckpt: Path) -> list[int]:
    commits = ckpt / "commits"
    return sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit()) if commits.exists() else []


def wait_for_batch(ckpt: Path, batch: int, query: StreamingQuery, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while batch not in committed(ckpt):
        if query.exception() is not None:
            raise AssertionError(f"query failed: {query.exception()}")
        assert time.time() < deadline, f"batch {batch} was not committed in {timeout} s"
        time.sleep(0.05)


class Asker:
    """Asks random keys (some absent) in a loop and checks every answer against the input at the
    batch it names; records what it saw."""

    def __init__(self, client: StateClient, files: list[list[tuple[str, int]]]) -> None:
        self.client, self.files = client, files
        self.batches: Counter[int] = Counter()
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self._expected: dict[int, dict[str, dict[str, int]]] = {}

    def expected(self, batch: int) -> dict[str, dict[str, int]]:
        if batch not in self._expected:
            self._expected[batch] = expected_state(self.files, batch)
        return self._expected[batch]

    def check(self, batch: int, key: str, found: bool, value: Any) -> None:
        want = self.expected(batch).get(key)
        if (want is not None) != found or (found and value != want):
            self.wrong.append(f"batch {batch} key {key}: answered {value if found else 'absent'}, input says {want}")
        self.batches[batch] += 1

    def _run(self) -> None:
        rnd = random.Random(5)
        while not self.stop.is_set():
            keys = [f"k{rnd.randrange(KEYS + 10)}" for _ in range(rnd.choice((1, 1, 5)))]  # k60..k69 never occur
            try:
                if len(keys) == 1:
                    a = self.client.get({"key": keys[0]})
                    self.check(a.batch, keys[0], a.found, a.value)
                else:
                    found = self.client.get_many([{"key": k} for k in keys])
                    for k, a in zip(keys, found.results, strict=True):
                        assert a.batch == found.batch
                        self.check(found.batch, k, a.found, a.value)
            except Exception as e:  # noqa: BLE001 - recorded, and the test fails on it
                self.errors.append(repr(e))
            time.sleep(0.002)


@pytest.mark.parametrize("restore_in", ["thread", "process"])
def test_every_answer_equals_the_input_at_the_batch_it_names(
    spark: SparkSession, tmp_path: Path, restore_in: str
) -> None:
    input_dir, ckpt = tmp_path / "in", tmp_path / "ckpt"
    files = write_files(input_dir, 0, 8)
    query = start_query(spark, input_dir, ckpt)
    killed: list[int] = []
    try:
        wait_for_batch(ckpt, 0, query)
        with StateClient(str(ckpt), poll_seconds=0.05, restore_in=restore_in) as client:
            asker = Asker(client, files)
            asker.thread.start()
            wait_for_batch(ckpt, 3, query)
            for pid in worker_pids(spark._jvm):  # a chaos fault: every state worker SIGKILLed mid-stream
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            wait_for_batch(ckpt, 7, query)
            query.stop()
            # The query restarts (a new run of the same checkpoint) with more input.
            files += write_files(input_dir, 8, 6)
            query = start_query(spark, input_dir, ckpt)
            wait_for_batch(ckpt, 13, query)
            deadline = time.time() + 10
            while client.batch != 13 and time.time() < deadline:
                time.sleep(0.05)
            time.sleep(0.3)
            asker.stop.set()
            asker.thread.join(10)
            assert client.batch == 13, client.status()
            # Time travel: every batch the stores retain (at least minBatchesToRetain=3) answers as
            # the input says it was; older ones the commit log still lists may be gone, and say so.
            answered = []
            for b in committed(ckpt):
                want = expected_state(files, b)
                try:
                    found = client.get_many([{"key": f"k{i}"} for i in range(KEYS)], batch=b)
                except BatchGoneError as e:
                    assert "no longer retained" in str(e) and b < 11, (b, e)
                    continue
                assert found.batch == b
                for i, a in enumerate(found.results):
                    assert (a.value if a.found else None) == want.get(f"k{i}"), (b, i)
                answered.append(b)
            assert {11, 12, 13} <= set(answered), answered
            with pytest.raises(BatchGoneError, match="not in the commit log"):
                client.get({"key": "k1"}, batch=99)
            scanned = client.scan(limit=1000)
            assert scanned.complete and scanned.batch == 13
            assert {r["key"]["key"]: r["value"] for r in scanned.rows} == expected_state(files, 13)
    finally:
        query.stop()
    assert killed, "no state worker was killed"
    assert not asker.errors, asker.errors[:5]
    assert not asker.wrong, asker.wrong[:5]
    # It followed the query: answers came from many batches, across the restart.
    assert len(asker.batches) >= 8 and max(asker.batches) == 13, sorted(asker.batches)


def tree_state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every file's size, mtime and bytes, and every directory's mtime (a file created and deleted
    again changes it)."""
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns, p.read_bytes() if p.is_file() else b"")
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture(scope="module")
def stopped_query(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list]:
    """A checkpoint of a stopped query (6 batches) and its input."""
    root = tmp_path_factory.mktemp("stopped")
    files = write_files(root / "in", 0, 6)
    query = start_query(spark, root / "in", root / "ckpt")
    try:
        wait_for_batch(root / "ckpt", 5, query)
    finally:
        query.stop()
    spark._jvm.org.apache.spark.sql.execution.streaming.state.StateStore.stop()  # no maintenance writes after
    return root / "ckpt", files


def test_the_client_never_writes_into_the_checkpoint(stopped_query: tuple[Path, list], tmp_path: Path) -> None:
    ckpt, files = stopped_query
    before = tree_state(ckpt)
    with StateClient(str(ckpt), follow=False, scratch=str(tmp_path), restore_in="process") as client:
        for b in committed(ckpt)[-3:]:
            client.get_many([{"key": f"k{i}"} for i in range(KEYS)], batch=b)
        client.scan(limit=5)
        client.operators()
        client.refresh()
    assert tree_state(ckpt) == before


def test_the_http_interface(stopped_query: tuple[Path, list]) -> None:
    ckpt, files = stopped_query
    want = expected_state(files, 5)
    with StateClient(str(ckpt), follow=False, restore_in="process") as client:
        served = Served(client)
        try:
            status, health = served.request("GET", "/healthz")
            assert status == 200 and not health["ready"] and health["storesOpen"] == 0, health  # nothing asked yet
            status, body = served.request("GET", f"/v1/state?key={key_param({'key': 'k7'})}")
            assert status == 200 and body["batch"] == 5 and body["found"] and body["value"] == want["k7"], body
            status, body = served.request("GET", f"/v1/state?key={key_param({'key': 'k99'})}&batch=4")
            assert status == 200 and body == {"batch": 4, "found": False, "value": None, "partition": body["partition"]}
            keys = [{"key": f"k{i}"} for i in range(KEYS + 5)]
            status, body = served.request("POST", "/v1/lookup", {"keys": keys, "operator": 0})
            assert status == 200 and body["batch"] == 5
            assert [r["value"] for r in body["results"]] == [want.get(k["key"]) for k in keys]
            status, body = served.request("GET", "/v1/scan?limit=3")
            assert status == 200 and len(body["rows"]) == 3 and not body["complete"]
            assert all(want[r["key"]["key"]] == r["value"] for r in body["rows"])
            status, body = served.request("GET", f"/v1/scan?key={key_param({'key': 'k7'})}&limit=5")
            assert status == 200 and body["complete"], body
            assert [(r["key"], r["value"]) for r in body["rows"]] == [({"key": "k7"}, want["k7"])], body
            status, body = served.request("GET", f"/v1/scan?key={key_param({'key': 'k99'})}")
            assert status == 200 and body["complete"] and body["rows"] == [], body
            status, body = served.request("GET", "/v1/operators")
            assert status == 200 and body["operators"][0]["stores"][0]["keyColumns"] == ["key"]
            status, health = served.request("GET", "/healthz")
            assert status == 200 and health["ready"] and health["storesOpen"] == health["storesTotal"] == 4, health
            status, text = served.request("GET", "/metrics")
            assert status == 200 and b"pystatestore_serve_latency_seconds_bucket" in text
            assert b'pystatestore_serve_requests_total{endpoint="state",status="200"} 2.0' in text
            # Bad questions get a 400 naming what is wrong.
            for path, words in (
                (f"/v1/state?key={key_param({'key': 7})}", "key column 'key' is string"),
                (f"/v1/state?key={key_param({'nope': 'x'})}", "nope"),
                (f"/v1/state?key={key_param({'key': 'k1'})}&operator=3", "no store 'default' of operator 3"),
                (f"/v1/state?key={key_param({'key': 'k1'})}&store=..%2F..%2Fetc", "no store '../../etc'"),
                (f"/v1/state?key={key_param({'key': 'k1'})}&family=v", "no state variables"),
                ("/v1/state?key=%7Bnot-json", "key is not JSON"),
                ("/v1/state", "give key="),
                ("/v1/scan?limit=0", "limit must be at least 1"),
            ):
                status, body = served.request("GET", path)
                assert status == 400 and words in body["error"], (path, status, body)
            status, body = served.request("POST", "/v1/lookup", {"keys": "k1"})
            assert status == 400, body
            status, body = served.request("GET", f"/v1/state?key={key_param({'key': 'k1'})}&batch=1000")
            assert status == 404 and body["file"] == "commits/1000", body
        finally:
            served.close()


def test_a_token_is_checked_on_every_request_and_required_off_loopback(stopped_query: tuple[Path, list]) -> None:
    ckpt, _ = stopped_query
    with pytest.raises(ServeConfigError, match="token"):
        check_binding("0.0.0.0", None)
    check_binding("127.0.0.1", None)
    check_binding("::1", None)
    check_binding("0.0.0.0", "s3cret")
    result = CliRunner().invoke(main, ["serve", str(ckpt), "--host", "0.0.0.0"], env={"PYSTATESTORE_SERVE_TOKEN": ""})
    assert result.exit_code != 0 and "token" in result.output, result.output
    with StateClient(str(ckpt), follow=False) as client:
        served = Served(client, token="s3cret")
        try:
            path = f"/v1/state?key={key_param({'key': 'k1'})}"
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                status, _ = served.request("GET", path, headers=headers)
                assert status == 401, headers
            assert served.request("GET", "/metrics")[0] == 401
            assert served.request("GET", path, headers={"Authorization": "Bearer s3cret"})[0] == 200
        finally:
            served.close()


def test_a_damaged_file_fails_only_its_store(stopped_query: tuple[Path, list], tmp_path: Path) -> None:
    ckpt, files = stopped_query
    copy = tmp_path / "ckpt"
    shutil.copytree(ckpt, copy)
    newest = max(committed(copy)) + 1
    damaged = copy / "state" / "0" / "1" / "manifests" / f"{newest}.json"
    damaged.write_bytes(damaged.read_bytes()[:40])  # torn
    want = expected_state(files, newest - 1)
    with StateClient(str(copy), follow=False) as client:
        served = Served(client)
        try:
            answered = failed = 0
            for i in range(KEYS):
                status, body = served.request("GET", f"/v1/state?key={key_param({'key': f'k{i}'})}")
                if status == 200:
                    assert body["partition"] != 1 and (body["value"] if body["found"] else None) == want.get(f"k{i}")
                    answered += 1
                else:
                    assert status == 500 and body["file"] == f"manifests/{newest}.json" and "/0/1" in body["store"], (
                        body
                    )
                    failed += 1
            assert answered and failed, (answered, failed)
        finally:
            served.close()
    with StateClient(str(copy), follow=False) as client, pytest.raises(QuestionError):
        client.get({"key": 1})
    # A batch the commit log lists whose versions retention took: 404, not a wrong answer.
    for store in (copy / "state" / "0").iterdir():
        for gone in [*store.glob("manifests/*.json"), *store.glob("snapshots/*.json")]:
            if int(gone.name.split(".")[0].split("-")[0]) <= 3:  # batch 2 is version 3
                gone.unlink()
    with StateClient(str(copy), follow=False) as client:
        served = Served(client)
        try:
            status, body = served.request("GET", f"/v1/state?key={key_param({'key': 'k1'})}&batch=2")
            assert status == 404 and "no longer retained" in body["error"], body
        finally:
            served.close()


def test_a_dead_restore_process_fails_its_restore_by_name_and_a_new_one_takes_over(
    stopped_query: tuple[Path, list], tmp_path: Path
) -> None:
    ckpt, files = stopped_query
    last = max(committed(ckpt))
    with StateClient(str(ckpt), follow=False, scratch=str(tmp_path), restore_in="process") as client:
        assert client.get({"key": "k1"}).value == expected_state(files, last).get("k1")
        restores = client._restores
        assert restores is not None and restores._process is not None
        os.kill(restores._process.pid, signal.SIGKILL)  # as the OS's OOM killer would
        restores._process.wait(10)
        with pytest.raises(StateStoreError, match=r"ended \(exit code -9\)"):
            client.get({"key": "k1"}, batch=last - 1)  # a restore the dead process was asked for
        found = client.get({"key": "k1"}, batch=last - 2)  # the next starts a new one
        assert found.value == expected_state(files, last - 2).get("k1")
        assert client.get({"key": "k2"}).value == expected_state(files, last).get("k2")  # opened before: still open
        child = restores._process
    assert child.poll() is not None, "the restore process outlived its client"
    assert not list(tmp_path.iterdir()), "the restores' scratch space was left behind"


def test_the_restore_process_removes_the_version_directories_the_asker_closed(
    stopped_query: tuple[Path, list], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed version's directory is removed by the restore process, not by the process that
    answers (whose GIL the answers need): it goes once its batch is let go, and this process never
    removes it itself."""
    ckpt, files = stopped_query
    removed_here: list[Path] = []
    monkeypatch.setattr(versions, "_remove_tree", removed_here.append)
    last = max(committed(ckpt))
    with StateClient(str(ckpt), follow=False, scratch=str(tmp_path), restore_in="process", history_batches=1) as client:
        assert client.get({"key": "k3"}, batch=last - 1).value == expected_state(files, last - 1).get("k3")
        first = [v.path for v in client._history[last - 1][0].opened().values()]
        assert first and all(p is not None and p.is_dir() for p in first)
        assert client.get({"key": "k3"}, batch=last - 2).value == expected_state(files, last - 2).get("k3")
        assert last - 1 not in client._history  # let go: one older batch is kept
        deadline = time.time() + 20
        while any(p.exists() for p in first) and time.time() < deadline:
            client.get({"key": "k4"}, batch=last - 2)  # any request carries what was not sent yet
            time.sleep(0.05)
        assert not any(p.exists() for p in first), "the closed version's directory was left behind"
    assert removed_here == [], f"the answering process removed {removed_here} itself"


def test_the_restore_process_removes_nothing_outside_its_scratch_space(tmp_path: Path) -> None:
    scratch, outside = tmp_path / "scratch", tmp_path / "outside"
    (scratch / "v5-1").mkdir(parents=True)
    outside.mkdir()
    (outside / "keep").write_text("x")
    (scratch / "link").symlink_to(outside)
    remove_discarded(
        [str(outside), str(scratch), str(scratch / "link"), str(scratch / ".." / "outside"), str(scratch / "v5-1")],
        str(scratch),
    )
    assert (outside / "keep").exists() and scratch.is_dir() and (scratch / "link").is_symlink()
    assert not (scratch / "v5-1").exists()


def test_the_client_follows_a_checkpoint_repartitioned_in_place(spark: SparkSession, tmp_path: Path) -> None:
    """The query stopped, its checkpoint repartitioned (`pystatestore repartition`) and moved into
    the old one's place, the query restarted there: the client reads the checkpoint afresh and
    answers from the new partitions, as the input says."""
    input_dir, ckpt = tmp_path / "in", tmp_path / "ckpt"
    files = write_files(input_dir, 0, 4)
    query = start_query(spark, input_dir, ckpt)
    try:
        wait_for_batch(ckpt, 3, query)
    finally:
        query.stop()
    with StateClient(str(ckpt), poll_seconds=0.05) as client:
        assert client.get({"key": "k5"}).value == expected_state(files, 3)["k5"]
        result = CliRunner().invoke(main, ["repartition", str(ckpt), "--partitions", "7", "-o", str(tmp_path / "new")])
        assert result.exit_code == 0, result.output
        ckpt.rename(tmp_path / "old")
        (tmp_path / "new").rename(ckpt)
        files += write_files(input_dir, 4, 3)
        final = max(committed(ckpt)) + 3  # after the rewrite's own batch, which reads no input
        query = start_query(spark, input_dir, ckpt)
        try:
            wait_for_batch(ckpt, final, query)
        finally:
            query.stop()
        deadline = time.time() + 20
        while client.batch != final and time.time() < deadline:
            time.sleep(0.05)
        assert client.batch == final, client.status()
        want = expected_state(files, len(files) - 1)
        found = client.get_many([{"key": f"k{i}"} for i in range(KEYS)])
        assert [a.value if a.found else None for a in found.results] == [want.get(f"k{i}") for i in range(KEYS)]
        assert {a.partition for a in found.results} - set(range(4)), "no key answered from partitions 4..6"
