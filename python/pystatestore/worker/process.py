"""The Python state worker process: `python -m pystatestore.worker` (see __main__.py), started by the JVM shim.

The JVM writes one line to the worker's stdin, `{"port": P, "token": T}`, and keeps the pipe open:
so the gateway token never appears on a command line or in /proc/<pid>/environ. The worker connects
to the shim's Py4J gateway (loopback only, authenticated with the token), serves StoreService through
a callback server bound to loopback with the same token, and exits, closing its stores, when the JVM
closes its stdin (the JVM exited or replaced it).
"""

from __future__ import annotations

import importlib.abc
import json
import logging
import os
import sys

from py4j.java_gateway import CallbackServerParameters, GatewayParameters, JavaGateway

LOOPBACK = "127.0.0.1"


def read_handshake(stream) -> tuple[int, str]:  # noqa: ANN001 - a binary file object
    """The first stdin line: port and token from the JVM. Raises ValueError when malformed."""
    line = stream.readline(4096)
    doc = json.loads(line.decode("utf-8"))
    return int(doc["port"]), str(doc["token"])


# Modules pyarrow loads when they are installed, which the worker never uses: pyarrow imports numpy
# when it is imported (~13 MiB resident) and pandas on its first array conversion, only to check
# whether an argument is a pandas object (~35 MiB). Every worker in the pool would pay both.
UNUSED_IN_WORKER = ("numpy", "pandas")


class _Unused(importlib.abc.MetaPathFinder):
    """Refuses to import UNUSED_IN_WORKER; pyarrow then works as where they are not installed."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        if name.split(".", 1)[0] in UNUSED_IN_WORKER:
            raise ModuleNotFoundError(f"the pystatestore state worker does not load {name}", name=name)
        return None


GIL_SWITCH_SECONDS = 0.0005


def main() -> int:
    sys.meta_path.insert(0, _Unused())
    # Calls from the JVM and the work durable-first commits leave after their replies share the
    # GIL: a call waiting for it waits at most this long while that work runs Python code (the
    # default, 5 ms, is longer than a small commit's whole reply path).
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    from .service import StoreService  # imports pyarrow: only once the finder is in place

    logging.basicConfig(
        level=os.environ.get("PYSTATESTORE_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s [pid %(process)d]: %(message)s",
    )
    logging.getLogger("py4j").setLevel(logging.WARNING)  # py4j logs every call at INFO
    log = logging.getLogger("pystatestore.worker")
    try:
        port, token = read_handshake(sys.stdin.buffer)
    except (ValueError, KeyError, TypeError) as e:
        log.error(
            "no valid handshake on stdin (%s): the worker is started by the pystatestore JVM shim, not by hand", e
        )
        return 2
    gateway = JavaGateway(
        gateway_parameters=GatewayParameters(address=LOOPBACK, port=port, auth_token=token, auto_convert=False),
        callback_server_parameters=CallbackServerParameters(
            address=LOOPBACK, port=0, auth_token=token, daemonize=True, daemonize_connections=True
        ),
    )
    del token
    service = StoreService()
    callback_port = gateway.get_callback_server().get_listening_port()
    gateway.entry_point.register(service, callback_port)
    log.info("pystatestore worker serving (gateway port %d, callback port %d)", port, callback_port)
    sys.stdin.buffer.read()  # blocks until the JVM closes the pipe
    log.info("JVM closed the worker's stdin; closing stores and exiting")
    try:
        service.close_all()
        gateway.shutdown()
    finally:
        os._exit(0)
