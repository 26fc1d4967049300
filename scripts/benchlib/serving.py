"""The queryable-state benches' side of `pystatestore serve` (bench_queryable.py, and
probe_follow_latency.py, which replays the bench's checkpoint): the asking client, lean so it takes
little of the cores the query and the service need; whether the service is ready; a copy of a
checkpoint frozen at its first batches; latency percentiles."""

from __future__ import annotations

import argparse
import json
import random
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path


class KeepAlive:
    """One keep-alive HTTP/1.1 connection, lean so the client takes little of the 2 cores the query
    and the service need: each GET written as bytes, each response read by httptools (the parser
    uvicorn uses, installed with the serve extra). http.client costs about 85 us of CPU a request
    here, this about a quarter of it."""

    def __init__(self, port: int) -> None:
        import httptools

        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.parser = httptools.HttpResponseParser(self)
        self.body: list[bytes] = []
        self.complete = False

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.complete = True

    def get(self, path: str) -> tuple[int, bytes]:
        self.body, self.complete = [], False
        self.sock.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        while not self.complete:
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the service closed the connection")
            self.parser.feed_data(data)
        return self.parser.get_status_code(), b"".join(self.body)


def asker_child(args: argparse.Namespace) -> None:
    """Asks for random keys over --connections keep-alive connections (a thread each) until
    --seconds pass, each connection on its own schedule of --rate / --connections lookups a second
    (--rate 0: the next as soon as an answer came); writes (due time, latency s, batch, found,
    status) per answer, the latency counted from when the lookup was due."""
    answers: list[tuple[float, float, int, bool, int]] = []
    errors: list[str] = []
    connections = int(args.connections)
    interval = connections / float(args.rate) if float(args.rate) > 0 else 0.0
    deadline = time.time() + float(args.seconds)

    def ask(seed: int) -> None:
        rnd = random.Random(seed)
        conn = KeepAlive(int(args.port))
        mine = []
        # perf_counter schedules the sends; the wall clock names them, to match the query's batches
        wall_offset = time.time() - time.perf_counter()
        due = time.perf_counter() + interval * seed / connections  # connections spread over an interval
        while due + wall_offset < deadline:
            if interval:
                wait = due - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            else:
                due = time.perf_counter()
            key = rnd.randrange(args.keys * 10 // 9)  # a tenth of the keys asked for were never written
            path = "/v1/state?key=" + urllib.parse.quote(json.dumps({"key": key}))
            status, body = conn.get(path)
            latency = time.perf_counter() - due
            batch, found = -1, False
            if status == 200:
                parsed = json.loads(body)
                batch, found = parsed["batch"], parsed["found"]
                if found != (key < args.keys):
                    errors.append(f"key {key}: found={found}, but it was {'' if key < args.keys else 'never '}written")
            mine.append((due + wall_offset, latency, batch, found, status))
            due += interval
        answers.extend(mine)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"wrong answers: {errors[:5]}")
    Path(args.out).write_text(json.dumps(sorted(answers)))


def service_ready(port: int) -> bool:
    """Whether `pystatestore serve` on `port` says every store is open (GET /healthz)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
            return bool(json.loads(r.read()).get("ready"))
    except OSError:
        return False


def frozen_copy(checkpoint: Path, dest: Path, batches: int) -> None:
    """A copy of `checkpoint` whose commit log shows only its first `batches` batches; files the
    query wrote or deleted during the copy belong to later versions, which the copy never serves."""
    shutil.rmtree(dest, ignore_errors=True)
    try:
        shutil.copytree(checkpoint, dest)
    except shutil.Error:
        pass  # a file of a later version written or GC'd under the copy
    for log in ("commits", "offsets"):
        for entry in (dest / log).iterdir():
            batch = entry.name.lstrip(".").removesuffix(".crc")
            if batch.isdigit() and int(batch) >= batches:
                entry.unlink()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def answered_ms(answers: list[list[float]]) -> list[float]:
    """The latencies, in ms, of the lookups answered 200 (the asker's rows: due, latency s, batch,
    found, status)."""
    return [a[1] * 1000 for a in answers if a[4] == 200]
