"""`pystatestore serve`: a StateClient over HTTP (Starlette on uvicorn), JSON in and out, keys and
values as `pystatestore read -o -` prints them.

    GET  /v1/state?key=<JSON object>[&operator=N][&store=NAME][&family=VAR][&batch=N]
    POST /v1/lookup   {"keys": [{...}, ...], "operator": N, "store": ..., "family": ..., "batch": ...}
    GET  /v1/scan?[key=<JSON object of some key columns>][&limit=N][&cursor=C][&operator=N]...
    GET  /v1/operators, GET /healthz, GET /metrics (Prometheus' text format)

A scan answers one page: `limit` rows (the client's scan_limit_default, 100, unless it asks; above
scan_limit_max, 10,000, a 400), partition by partition and in stored key order within one. When
more rows remain, `complete` is false and `cursor` continues after the page's last row at the batch
the first page named (paging.py): every matching row comes exactly once; a cursor whose batch
retention took gets a 404, a garbled one a 400.

A lookup asks at most the client's lookup_keys_max keys (1,000; above, a 400 naming it and saying to
split them). Its body may hold 4 KiB for each of those keys plus 64 KiB (limits.py), counted as it
is read: a Content-Length above that is refused before any of the body is read, and a body that
goes past it (chunked) as soon as it does, a 413 either way (and the connection closed, so the rest
is never read). A key= in a query string holds at most 4,096 characters (a 414 above). Below the
application, uvicorn's parser bounds the URL: httptools (the `serve` extra's) refuses one over
65,535 bytes with a 400, though only once it holds it whole, and bounds no header; h11 refuses a
request head whose unparsed part passes 16 KiB (a head arriving in one read may be longer).

A question the checkpoint cannot answer as asked (a malformed number, key, body or cursor among
them) gets a 400 naming what is wrong; a batch no longer retained a 404; a damaged or missing file
a 500 naming store, version and file (every other store keeps answering). It binds loopback by
default; any other address (0.0.0.0, ::) needs a token, checked on every request (`Authorization:
Bearer <token>`). The service only reads the checkpoint and takes no path from a request.
`pystatestore serve` checks SERVER_MODULES import before it opens anything.
"""

from __future__ import annotations

import hmac
import importlib
import ipaddress
import json
import re
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from ..store.errors import StateStoreError
from .client import BatchGoneError, QuestionError, StateClient
from .limits import body_too_large, key_text_too_long, lookup_body_max

TOKEN_ENV = "PYSTATESTORE_SERVE_TOKEN"
# What the service imports (the `serve` extra). uvicorn's httptools and uvloop, also in the extra,
# are speedups it falls back from (to h11 and asyncio), so the service runs without them.
SERVER_MODULES = ("starlette", "uvicorn", "prometheus_client")
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class ServeConfigError(ValueError):
    """`pystatestore serve` started in a way that would expose the state unprotected."""


def missing_server_modules() -> list[str]:
    """The modules of SERVER_MODULES that do not import here (the `serve` extra not installed)."""
    missing = []
    for name in SERVER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    return missing


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    """Loopback needs no token; anything else (a LAN address, 0.0.0.0) does."""
    if not is_loopback(host) and not token:
        raise ServeConfigError(
            f"serving on {host} would let anyone who reaches it read the query's state: give a token "
            f"(--token-file FILE, or the environment variable {TOKEN_ENV}), or bind 127.0.0.1"
        )


class _Metrics:
    """The service's Prometheus metrics, in a registry of its own."""

    def __init__(self, client: StateClient) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        self._children: dict[tuple[str, int], Any] = {}
        self.requests = Counter(
            "pystatestore_serve_requests",
            "Requests answered, by endpoint and HTTP status",
            ["endpoint", "status"],
            registry=self.registry,
        )
        self.keys = Counter("pystatestore_serve_keys", "Keys looked up", registry=self.registry)
        self.latency = Histogram(
            "pystatestore_serve_latency_seconds",
            "Time to answer, by endpoint",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        served = Gauge("pystatestore_serve_batch", "The committed batch answers come from", registry=self.registry)
        served.set_function(lambda: client.batch)
        newest = Gauge(
            "pystatestore_serve_committed_batch",
            "The newest batch in the commit log at the last check",
            registry=self.registry,
        )
        newest.set_function(lambda: client.newest_committed)
        lag = Gauge(
            "pystatestore_serve_lag_batches",
            "Batches the commit log is ahead of the batch served",
            registry=self.registry,
        )
        lag.set_function(lambda: max(0, client.newest_committed - client.batch))
        since = Gauge(
            "pystatestore_serve_seconds_since_poll",
            "Seconds since the commit log was last checked",
            registry=self.registry,
        )
        since.set_function(lambda: time.time() - client.last_poll)

    def answered(self, endpoint: str, status: int, seconds: float) -> None:
        counted = self._children.get((endpoint, status))
        if counted is None:
            counted = self._children[endpoint, status] = (
                self.requests.labels(endpoint, str(status)),
                self.latency.labels(endpoint),
            )
        counted[0].inc()
        counted[1].observe(seconds)

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(client: StateClient, token: str | None = None) -> Any:
    """The ASGI application answering for `client`. GET /v1/state, the question asked thousands of
    times a second, is answered by a plain ASGI function (uvicorn still speaks HTTP); the rest go
    through Starlette's routing. Both share the token check, the error mapping and the metrics."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import ClientDisconnect, Request
    from starlette.responses import Response
    from starlette.routing import Route

    metrics = _Metrics(client)
    body_max = lookup_body_max(client.lookup_keys_max)
    expected = f"Bearer {token}".encode() if token else None

    async def respond(name: str, authorization: bytes, answer: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
        """(HTTP status, JSON payload or a ready Response) of one request, counted in the metrics."""
        started = time.perf_counter()
        status, payload = 200, None
        if expected is not None and not hmac.compare_digest(authorization, expected):
            status, payload = 401, {"error": "a valid token is required: Authorization: Bearer <token>"}
        else:
            try:
                payload = await answer()
            except QuestionError as e:
                status, payload = 400, _failure(e.problem, store=e.store)
            except BatchGoneError as e:
                status, payload = (
                    404,
                    _failure(e.problem, store=e.store, version=e.version, file=e.file, advice=e.advice),
                )
            except StateStoreError as e:
                status, payload = (
                    500,
                    _failure(e.problem, store=e.store, version=e.version, file=e.file, advice=e.advice),
                )
            except _BadRequestError as e:
                status, payload = 400, _failure(str(e))
            except _TooLongError as e:
                status, payload = 414, _failure(str(e))
            except _TooLargeError as e:
                status, payload = 413, _failure(str(e))
        metrics.answered(name, status, time.perf_counter() - started)
        return status, payload

    def endpoint(name: str, fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            authorization = request.headers.get("authorization", "").encode()
            status, payload = await respond(name, authorization, lambda: fn(request))
            if isinstance(payload, Response):
                return payload
            # A body refused unread: closing the connection spares reading (and discarding) the rest.
            headers = {"connection": "close"} if status == 413 else None
            return Response(_json_bytes(payload), status, headers, media_type="application/json")

        return handle

    async def answered(fn: Callable[..., Any], *args: Any, **where: Any) -> Any:
        # The batch followed is open already (the follower brings it forward in its own thread), so
        # its answers come inline: a thread hop would cost more than the lookup. Another batch may
        # need a restore first: that waits in a thread, not in the event loop.
        if where.get("batch") is None:
            return fn(*args, **where)
        return await run_in_threadpool(fn, *args, **where)

    async def state(q: Any) -> Any:
        key = _json_param(q.get("key"), "key", required=True, advice=_LONG_KEY_ADVICE)
        found = await answered(client.get, key, **_where(q))
        metrics.keys.inc()
        return found.to_json()

    async def read_body(request: Request) -> bytes:
        """The body, refused (413) once it is more than body_max bytes: before reading any when its
        Content-Length says so, else as soon as it goes past, never holding more than that."""
        declared = request.headers.get("content-length", "")
        if declared.isascii() and declared.isdigit() and int(declared) > body_max:
            raise _TooLargeError(body_too_large(int(declared), body_max, client.lookup_keys_max))
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > body_max:
                    raise _TooLargeError(body_too_large(None, body_max, client.lookup_keys_max))
        except ClientDisconnect:
            raise _BadRequestError("the connection closed before the body ended") from None
        return bytes(body)

    async def lookup(request: Request) -> Any:
        raw = await read_body(request)
        try:
            body = json.loads(raw)
        except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested past Python's stack
            raise _BadRequestError(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("keys"), list):
            raise _BadRequestError(
                'the body is {"keys": [{...}, ...], "operator": N, "store": ..., "family": ..., "batch": ...}'
            )
        unknown = set(body) - {"keys", "operator", "store", "family", "batch"}
        if unknown:
            raise _BadRequestError(f"unknown field(s) {', '.join(sorted(unknown))}")
        found = await answered(client.get_many, body["keys"], **_where(body))
        metrics.keys.inc(len(body["keys"]))
        return found.to_json()

    async def scan(request: Request) -> Any:
        q = request.query_params
        key = _json_param(q.get("key"), "key", required=False, advice=_LONG_PARTIAL_KEY_ADVICE)
        limit = _int_param(q.get("limit"), "limit", None)
        found = await run_in_threadpool(client.scan, key, limit=limit, cursor=q.get("cursor"), **_where(q))
        return found.to_json()

    async def operators(request: Request) -> Any:
        return {"batch": client.batch, "operators": await run_in_threadpool(client.operators)}

    async def healthz(request: Request) -> Any:
        return client.status()

    async def prometheus(request: Request) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/state", endpoint("state", lambda request: state(request.query_params)), methods=["GET"]),
        Route("/v1/lookup", endpoint("lookup", lookup), methods=["POST"]),
        Route("/v1/scan", endpoint("scan", scan), methods=["GET"]),
        Route("/v1/operators", endpoint("operators", operators), methods=["GET"]),
        Route("/healthz", endpoint("healthz", healthz), methods=["GET"]),
        Route("/metrics", endpoint("metrics", prometheus), methods=["GET"]),
    ]
    routed = Starlette(routes=routes)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/v1/state" or scope["method"] != "GET":
            await routed(scope, receive, send)
            return
        # Starlette's query parameters: the query string as latin-1, the last of a repeated name
        params = dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True))
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        status, payload = await respond("state", authorization, lambda: state(params))
        body = _json_bytes(payload)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _failure(message: str, **fields: Any) -> dict[str, Any]:
    return {"error": message, **{k: v for k, v in fields.items() if v is not None}}


def _json_bytes(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


class _BadRequestError(ValueError):
    """A request that is not well formed (HTTP 400)."""


class _TooLongError(ValueError):
    """A query string's key longer than limits.KEY_TEXT_MAX (HTTP 414)."""


class _TooLargeError(ValueError):
    """A body larger than a lookup's may be (HTTP 413)."""


_LONG_KEY_ADVICE = 'ask for it with POST /v1/lookup {"keys": [...]}, whose body has room for longer keys'
_LONG_PARTIAL_KEY_ADVICE = "scan on fewer key columns and filter the rows it returns"


def _json_param(text: str | None, name: str, *, required: bool, advice: str) -> Any:
    """The JSON of query parameter `name`; refused unparsed when longer than a key may be."""
    if text is None:
        if required:
            raise _BadRequestError(f'give {name}=<JSON object>, e.g. {name}={{"id": 7}}')
        return None
    too_long = key_text_too_long(name, len(text), advice)
    if too_long is not None:
        raise _TooLongError(too_long)
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise _BadRequestError(f"{name} is not JSON: {e}") from None


_WHOLE_NUMBER = re.compile(r"-?[0-9]+")


def _int_param(value: Any, name: str, default: int | None) -> int | None:
    """A whole number from a query parameter's digits or a JSON integer (not 1.5, "1e3" or true);
    the client checks its range."""
    if value is None:
        return default
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and _WHOLE_NUMBER.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # more digits than Python converts
            pass
    raise _BadRequestError(f"{name} is a whole number, not {value!r}")


def _where(params: Any) -> dict[str, Any]:
    """operator, store, family and batch of a question, from query parameters or a JSON body."""
    where: dict[str, Any] = {"operator": _int_param(params.get("operator"), "operator", 0)}
    store = params.get("store")
    if store is not None:
        if not isinstance(store, str):
            raise _BadRequestError(f"store is a name, not {store!r}")
        where["store"] = store
    family = params.get("family")
    if family is not None:
        if not isinstance(family, str):
            raise _BadRequestError(f"family is a name, not {family!r}")
        where["family"] = family
    where["batch"] = _int_param(params.get("batch"), "batch", None)
    return where


def serve(client: StateClient, host: str, port: int, token: str | None, log_level: str = "warning") -> None:
    """Answers on host:port until interrupted."""
    import uvicorn

    check_binding(host, token)
    threading.Thread(target=client.open_all, name="pystatestore-open-all", daemon=True).start()
    # Not behind a proxy by default, and no access log: each costs every request a little CPU, taken
    # from the query on a small machine.
    uvicorn.run(
        create_app(client, token),
        host=host,
        port=port,
        log_level=log_level,
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


__all__ = [
    "SERVER_MODULES",
    "ServeConfigError",
    "TOKEN_ENV",
    "check_binding",
    "create_app",
    "is_loopback",
    "missing_server_modules",
    "serve",
]
