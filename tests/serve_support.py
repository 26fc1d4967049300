"""The queryable-state service on a real uvicorn server on loopback, and requests to it (shared by
test_queryable_state.py and test_serve_requests.py)."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.parse
from typing import Any

from pystatestore.queryable import StateClient
from pystatestore.queryable.server import create_app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(port: int, method: str, path: str, body: Any = None, headers: dict | None = None) -> tuple[int, Any]:
    """(status, JSON payload or raw bytes). `body`: bytes as they are, anything else as JSON."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body)
        conn.request(method, path, data, headers or {})
        r = conn.getresponse()
        raw = r.read()
        return r.status, (json.loads(raw) if r.getheader("content-type", "").startswith("application/json") else raw)
    finally:
        conn.close()


class Served:
    """`create_app` on a real uvicorn server in a thread, and requests to it."""

    def __init__(self, client: StateClient, token: str | None = None) -> None:
        import uvicorn

        self.port = free_port()
        config = uvicorn.Config(create_app(client, token), host="127.0.0.1", port=self.port, log_level="error")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.time() + 20
        while not self.server.started:
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.02)

    def request(self, method: str, path: str, body: Any = None, headers: dict | None = None) -> tuple[int, Any]:
        return request(self.port, method, path, body, headers)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def key_param(key: Any) -> str:
    return urllib.parse.quote(json.dumps(key))


def raw_exchange(port: int, head: bytes, body: bytes = b"", timeout: float = 30) -> tuple[int, dict[str, str], Any]:
    """Sends `head` (request line and headers, up to the blank line) and `body` as they are, and reads
    the answer until the server closes the connection: (status, headers, JSON payload). Fails when
    the server neither answers nor closes within `timeout` (it is waiting for more of the body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(head + body)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
        except TimeoutError:
            raise AssertionError(
                f"no answer and no close within {timeout} s: the server waits for more of the body; got {received!r}"
            ) from None
    top, _, payload = received.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), headers, json.loads(payload)
