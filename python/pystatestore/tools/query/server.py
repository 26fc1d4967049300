"""`pystatestore serve`: a StateClient over HTTP (Starlette on uvicorn), JSON in and out, keys and
values as `pystatestore read -o -` prints them.

    GET  /v1/state?key=<JSON object>[&operator=N][&store=NAME][&family=VAR][&batch=N]
    POST /v1/lookup   {"keys": [{...}, ...], "operator": N, "store": ..., "family": ..., "batch": ...}
    GET  /v1/scan?[key=<JSON object of some key columns>][&limit=N][&operator=N]...
    GET  /v1/operators, GET /healthz, GET /metrics (Prometheus' text format)

A question the checkpoint cannot answer as asked gets a 400 naming what is wrong; a batch no longer
retained a 404; a damaged or missing file a 500 naming store, version and file (every other store
keeps answering). It binds loopback by default; any other address needs a token, checked on every
request (`Authorization: Bearer <token>`). The service only reads the checkpoint and takes no path
from a request.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...store.errors import StateStoreError
from .client import BatchGoneError, QuestionError, StateClient

TOKEN_ENV = "PYSTATESTORE_SERVE_TOKEN"
LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class ServeConfigError(ValueError):
    """`pystatestore serve` started in a way that would expose the state unprotected."""


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

    def text(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


def create_app(client: StateClient, token: str | None = None) -> Any:
    """The ASGI application answering for `client`."""
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    metrics = _Metrics(client)
    expected = f"Bearer {token}".encode() if token else None

    def failure(status: int, message: str, **fields: Any) -> JSONResponse:
        return JSONResponse({"error": message, **{k: v for k, v in fields.items() if v is not None}}, status)

    def endpoint(name: str, fn: Callable[[Request], Awaitable[Any]]) -> Callable[[Request], Awaitable[Response]]:
        async def handle(request: Request) -> Response:
            started = time.perf_counter()
            if expected is not None:
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    response: Response = failure(401, "a valid token is required: Authorization: Bearer <token>")
                    metrics.requests.labels(name, "401").inc()
                    return response
            try:
                result = await fn(request)
                response = result if isinstance(result, Response) else JSONResponse(result)
            except QuestionError as e:
                response = failure(400, e.problem, store=e.store)
            except BatchGoneError as e:
                response = failure(404, e.problem, store=e.store, version=e.version, file=e.file, advice=e.advice)
            except StateStoreError as e:
                response = failure(500, e.problem, store=e.store, version=e.version, file=e.file, advice=e.advice)
            except _BadRequestError as e:
                response = failure(400, str(e))
            metrics.requests.labels(name, str(response.status_code)).inc()
            metrics.latency.labels(name).observe(time.perf_counter() - started)
            return response

        return handle

    async def answered(fn: Callable[..., Any], *args: Any, **where: Any) -> Any:
        # The batch followed is open already (the follower brings it forward in its own thread), so
        # its answers come inline: a thread hop would cost more than the lookup. Another batch may
        # need a restore first: that waits in a thread, not in the event loop.
        if where.get("batch") is None:
            return fn(*args, **where)
        return await run_in_threadpool(fn, *args, **where)

    async def state(request: Request) -> Any:
        q = request.query_params
        key = _json_param(q.get("key"), "key", required=True)
        metrics.keys.inc()
        return (await answered(client.get, key, **_where(q))).to_json()

    async def lookup(request: Request) -> Any:
        try:
            body = json.loads(await request.body())
        except json.JSONDecodeError as e:
            raise _BadRequestError(f"the body is not JSON: {e}") from None
        if not isinstance(body, dict) or not isinstance(body.get("keys"), list):
            raise _BadRequestError(
                'the body is {"keys": [{...}, ...], "operator": N, "store": ..., "family": ..., "batch": ...}'
            )
        unknown = set(body) - {"keys", "operator", "store", "family", "batch"}
        if unknown:
            raise _BadRequestError(f"unknown field(s) {', '.join(sorted(unknown))}")
        metrics.keys.inc(len(body["keys"]))
        return (await answered(client.get_many, body["keys"], **_where(body))).to_json()

    async def scan(request: Request) -> Any:
        q = request.query_params
        key = _json_param(q.get("key"), "key", required=False)
        limit = _int_param(q.get("limit"), "limit", 100)
        found = await run_in_threadpool(client.scan, key, limit=limit, **_where(q))
        return found.to_json()

    async def operators(request: Request) -> Any:
        return {"batch": client.batch, "operators": await run_in_threadpool(client.operators)}

    async def healthz(request: Request) -> Any:
        return client.status()

    async def prometheus(request: Request) -> Any:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(metrics.text(), media_type=CONTENT_TYPE_LATEST)

    routes = [
        Route("/v1/state", endpoint("state", state), methods=["GET"]),
        Route("/v1/lookup", endpoint("lookup", lookup), methods=["POST"]),
        Route("/v1/scan", endpoint("scan", scan), methods=["GET"]),
        Route("/v1/operators", endpoint("operators", operators), methods=["GET"]),
        Route("/healthz", endpoint("healthz", healthz), methods=["GET"]),
        Route("/metrics", endpoint("metrics", prometheus), methods=["GET"]),
    ]
    return Starlette(routes=routes)


class _BadRequestError(ValueError):
    """A request that is not well formed (HTTP 400)."""


def _json_param(text: str | None, name: str, *, required: bool) -> Any:
    if text is None:
        if required:
            raise _BadRequestError(f'give {name}=<JSON object>, e.g. {name}={{"id": 7}}')
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise _BadRequestError(f"{name} is not JSON: {e}") from None


def _int_param(value: Any, name: str, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool):
        raise _BadRequestError(f"{name} is a whole number, not {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _BadRequestError(f"{name} is a whole number, not {value!r}") from None


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
    uvicorn.run(create_app(client, token), host=host, port=port, log_level=log_level, access_log=False)


__all__ = ["ServeConfigError", "TOKEN_ENV", "check_binding", "create_app", "is_loopback", "serve"]
