"""`pystatestore serve`'s requests, without Spark: scans paged with a cursor under a capped limit,
lookups under a cap on their keys and their body's bytes, keys in query strings under a length cap,
malformed requests, the token and binding rules, and the command run without its `serve` extra.

The checkpoint is laid out as Spark writes one (metadata, offsets/ with the query's confs, commits/)
with state stores committed through the product's rocksdb backend, each key in the partition
Spark's hash partitioning sends it to. The referee is the input: each batch's puts and deletes,
applied to a dict here."""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from backend_support import changes, commit, make_backend, materialize_if_due
from pystatestore.queryable import BatchGoneError, QuestionError, StateClient
from pystatestore.queryable.server import ServeConfigError, check_binding
from pystatestore.reading.spark_hash import partition_of
from pystatestore.reading.unsafe_row import encode_row, parse_schema
from pystatestore.tools.cli import main
from serve_support import Served, free_port, key_param, raw_exchange, request

ROOT = Path(__file__).resolve().parent.parent
PARTITIONS = 3
BATCHES = 3
KEY_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "user", "type": "string", "nullable": True, "metadata": {}},
            {"name": "n", "type": "integer", "nullable": True, "metadata": {}},
        ],
    }
)
VALUE_SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "count", "type": "long", "nullable": False, "metadata": {}},
            {"name": "sum", "type": "long", "nullable": True, "metadata": {}},
        ],
    }
)
CONF = {"spark.sql.shuffle.partitions": str(PARTITIONS)}
State = dict[tuple[str, int], tuple[int, int]]


def write_checkpoint(root: Path) -> tuple[Path, dict[int, State]]:
    """BATCHES batches of puts and deletes over (user, n) keys; returns the checkpoint and the state
    after each batch as the input implies it."""
    ckpt = root / "ckpt"
    for log in ("offsets", "commits"):
        (ckpt / log).mkdir(parents=True)
    (ckpt / "metadata").write_text(json.dumps({"id": str(uuid.uuid4())}) + "\n")
    key_type, value_type = parse_schema(KEY_SCHEMA), parse_schema(VALUE_SCHEMA)
    backends = [
        make_backend(
            "rocksdb",
            ckpt / "state" / "0" / str(p),
            root / "work" / str(p),
            min_deltas=2,
            partition_id=p,
            schemas=(KEY_SCHEMA, VALUE_SCHEMA),
        )
        for p in range(PARTITIONS)
    ]
    rnd = random.Random(3)
    state: State = {}
    states = {}
    for batch in range(BATCHES):
        puts = {
            (f"u{rnd.randrange(8)}", rnd.randrange(10)): (rnd.randrange(1, 50), rnd.randrange(1000)) for _ in range(30)
        }
        deletes = [k for k in rnd.sample(sorted(state), min(8, len(state))) if k not in puts]
        state = states[batch] = {k: v for k, v in (state | puts).items() if k not in deletes}
        offsets = {"batchWatermarkMs": 0, "batchTimestampMs": 1_700_000_000_000 + batch, "conf": CONF}
        (ckpt / "offsets" / str(batch)).write_text(f'v1\n{json.dumps(offsets)}\n{{"logOffset":{batch}}}\n')
        for p, backend in enumerate(backends):

            def mine(key: tuple[str, int], p: int = p) -> bool:
                return partition_of(key_type, key, PARTITIONS) == p

            table = changes(
                {encode_row(key_type, k): encode_row(value_type, v) for k, v in puts.items() if mine(k)},
                [encode_row(key_type, k) for k in deletes if mine(k)],
            )
            commit(backend, batch, table, f"batch{batch}", num_keys=sum(1 for k in state if mine(k)))
            materialize_if_due(backend)
        (ckpt / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
    for backend in backends:
        backend.close()
    assert states[1] != states[2] and len(states[2]) > 40
    return ckpt, states


def as_rows(state: State, key: dict[str, Any] | None = None) -> dict[tuple[str, int], dict[str, int]]:
    """The rows a scan for `key` (some key columns) must return, from the input."""
    key = key or {}
    return {
        k: {"count": c, "sum": s}
        for k, (c, s) in state.items()
        if all({"user": k[0], "n": k[1]}[name] == want for name, want in key.items())
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, State]]:
    return write_checkpoint(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def served(built: tuple[Path, dict[int, State]]) -> Iterator[tuple[StateClient, Served]]:
    """A client with pages of 5 rows unless asked, at most 20, and lookups of at most 8 keys (so a
    body of at most 8 * 4,096 + 65,536 = 98,304 bytes), on a real server."""
    client = StateClient(str(built[0]), follow=False, scan_limit_default=5, scan_limit_max=20, lookup_keys_max=8)
    server = Served(client)
    yield client, server
    server.close()
    client.close()


def pages(server: Served, query: str) -> Iterator[dict[str, Any]]:
    """Every page of GET /v1/scan?`query`, following the cursors."""
    status, page = server.request("GET", f"/v1/scan?{query}")
    for _ in range(1000):
        assert status == 200, page
        yield page
        if page["cursor"] is None:
            return
        status, page = server.request("GET", f"/v1/scan?{query}&cursor={page['cursor']}")
    raise AssertionError("the scan did not end in 1,000 pages")


def paged_rows(pages_: Iterator[dict[str, Any]], limit: int, batch: int) -> list[tuple[tuple[str, int], Any]]:
    rows: list[tuple[tuple[str, int], Any]] = []
    seen = list(pages_)
    for i, page in enumerate(seen):
        last = i == len(seen) - 1
        assert page["batch"] == batch and page["complete"] == last and (page["cursor"] is None) == last, page
        assert len(page["rows"]) <= limit and (last or len(page["rows"]) == limit), page
        assert page["rows"] or len(seen) == 1, "a page after the last row: more rows were announced than remained"
        rows += [((r["key"]["user"], r["key"]["n"]), r["value"]) for r in page["rows"]]
    return rows


@pytest.mark.parametrize(
    ("key", "matching"),
    [(None, 46), ({"user": "u3"}, 5), ({"n": 1}, 6), ({"user": "nobody"}, 0)],  # u3 and n=1: in every partition
)
def test_paging_through_a_scan_returns_every_row_exactly_once(
    built: tuple[Path, dict[int, State]],
    served: tuple[StateClient, Served],
    key: dict[str, Any] | None,
    matching: int,
) -> None:
    _, states = built
    client, server = served
    want = as_rows(states[BATCHES - 1], key)
    assert len(want) == matching, want
    where = f"&key={key_param(key)}" if key else ""
    orders = []
    for limit in (1, 3, 20):
        rows = paged_rows(pages(server, f"limit={limit}{where}"), limit, BATCHES - 1)
        assert len(rows) == len({k for k, _ in rows}), "a row came twice"
        assert dict(rows) == want
        orders.append(rows)
    assert orders[0] == orders[1] == orders[2], "the order depends on the page size"
    # StateClient pages the same way.
    page = client.scan(key, limit=4)
    from_python = []
    while True:
        from_python += [((r["key"]["user"], r["key"]["n"]), r["value"]) for r in page.rows]
        if page.cursor is None:
            break
        page = client.scan(key, limit=4, cursor=page.cursor)
    assert page.complete and from_python == orders[0]


def test_a_page_holds_the_default_unless_asked_and_never_more_than_the_maximum(
    served: tuple[StateClient, Served],
) -> None:
    client, server = served
    status, page = server.request("GET", "/v1/scan")
    assert status == 200 and len(page["rows"]) == 5 and page["cursor"] and not page["complete"], page
    status, page = server.request("GET", "/v1/scan?limit=20")
    assert status == 200 and len(page["rows"]) == 20, page
    for limit in (21, 10**9):
        status, body = server.request("GET", f"/v1/scan?limit={limit}")
        assert status == 400 and "(20)" in body["error"] and "cursor" in body["error"], body
    with pytest.raises(QuestionError, match=r"\(20\)"):
        client.scan(limit=21)
    with pytest.raises(ValueError, match="default <= maximum"):
        StateClient(str(ROOT / "no-such-checkpoint"), scan_limit_default=30, scan_limit_max=20)
    result = CliRunner().invoke(
        main, ["serve", str(ROOT / "no-such-checkpoint"), "--scan-limit-default", "30", "--scan-limit-max", "20"]
    )
    assert result.exit_code == 2 and "above --scan-limit-max 20" in result.output, result.output


def test_a_cursor_continues_at_the_batch_its_first_page_named(
    built: tuple[Path, dict[int, State]], tmp_path: Path
) -> None:
    """The query commits a batch between two pages: the scan goes on at the first page's batch (its
    stores restored again), a scan of the new batch pages through versions served from their
    changes (layers.py), and once retention took the first batch its cursor gets a 404."""
    ckpt, states = shutil.copytree(built[0], tmp_path / "ckpt"), built[1]
    (ckpt / "commits" / "2").rename(tmp_path / "commit-2")  # state written, batch not yet committed
    with StateClient(str(ckpt), follow=False, scan_limit_default=5, scan_limit_max=20) as client:
        client.open_all()  # as the service does at its start
        server = Served(client)
        try:
            status, first = server.request("GET", "/v1/scan?limit=7")
            assert status == 200 and first["batch"] == 1 and first["cursor"], first
            (tmp_path / "commit-2").rename(ckpt / "commits" / "2")
            assert client.refresh() == 2
            rest = pages(server, f"limit=7&cursor={first['cursor']}")
            rows = paged_rows(iter([first, *rest]), 7, 1)
            assert dict(rows) == as_rows(states[1]) and len(rows) == len(states[1])
            layered = [len(v.layers) for v in client._served.opened().values()]
            assert layered and min(layered) >= 1, layered  # batch 2 is served from its changes
            rows = paged_rows(pages(server, "limit=7"), 7, 2)
            assert dict(rows) == as_rows(states[2]) and len(rows) == len(states[2])
            status, body = server.request("GET", f"/v1/scan?cursor={first['cursor']}&batch=2")
            assert status == 400 and "batch 1" in body["error"], body
        finally:
            server.close()
    for gone in ckpt.glob("state/0/*/*/2*.json"):  # retention takes batch 1 (version 2)
        gone.unlink()
    with StateClient(str(ckpt), follow=False) as client:
        server = Served(client)
        try:
            status, body = server.request("GET", f"/v1/scan?limit=7&cursor={first['cursor']}")
            assert status == 404 and "no longer retained" in body["error"], body
        finally:
            server.close()
        with pytest.raises(BatchGoneError):
            client.scan(limit=7, cursor=first["cursor"])


def test_a_garbled_changed_or_foreign_cursor_gets_a_400(served: tuple[StateClient, Served]) -> None:
    client, server = served
    status, page = server.request("GET", "/v1/scan?limit=3")
    cursor = page["cursor"]
    payload = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    moved = base64.urlsafe_b64encode(json.dumps({**payload, "partition": 2}).encode()).decode()
    flipped = cursor[:10] + ("A" if cursor[10] != "A" else "B") + cursor[11:]
    for query, words in (
        ("cursor=not-a-cursor", "not one this service returned"),
        (f"cursor={flipped}", "not one this service returned"),
        (f"cursor={moved}", "checksum"),
        ("cursor=", "not one this service returned"),
        (f"cursor={cursor}&key={key_param({'user': 'u1'})}", "another key"),
        (f"cursor={cursor}&limit=3&batch=0", "batch 2, not 0"),
    ):
        status, body = server.request("GET", f"/v1/scan?{query}")
        assert status == 400 and words in body["error"], (query, body)
    with pytest.raises(QuestionError, match="a cursor is the text"):
        client.scan(cursor=7)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("method", "path", "body", "words"),
    [
        ("GET", "/v1/state?key={K}&batch=abc", None, "batch is a whole number"),
        ("GET", "/v1/state?key={K}&batch=-1", None, "batch is a whole number, 0 or more"),
        ("GET", "/v1/state?key={K}&batch=1.5", None, "batch is a whole number"),
        ("GET", "/v1/state?key={K}&operator=x", None, "operator is a whole number"),
        ("GET", "/v1/state?key={K}&operator=-1", None, "operator is a whole number, 0 or more"),
        ("GET", "/v1/scan?limit=x", None, "limit is a whole number"),
        ("GET", "/v1/scan?limit=-3", None, "limit must be at least 1"),
        ("GET", "/v1/scan?limit=1e3", None, "limit is a whole number"),
        ("GET", "/v1/scan?batch=-2", None, "batch is a whole number, 0 or more"),
        ("GET", "/v1/scan?key=%5B1%5D", None, "a partial key is a JSON object"),
        ("GET", "/v1/state?key=%5B1%5D", None, "a key is a JSON object"),
        ("GET", "/v1/state?key=" + "%5B" * 4000, None, "key is not JSON"),
        ("POST", "/v1/lookup", b"{not json", "the body is not JSON"),
        ("POST", "/v1/lookup", b'{"keys": ["\xff"]}', "the body is not JSON"),
        ("POST", "/v1/lookup", b"[" * 90_000, "the body is not JSON"),
        ("POST", "/v1/lookup", {"keys": [], "limit": 3, "x": 1}, "unknown field(s) limit, x"),
        ("POST", "/v1/lookup", {"keys": {"user": "u1", "n": 1}}, 'the body is {"keys"'),
        ("POST", "/v1/lookup", {"keys": ["u1"]}, "a key is a JSON object"),
        ("POST", "/v1/lookup", {"keys": [{"user": "u1", "n": 1}, None]}, "a key is a JSON object"),
        ("POST", "/v1/lookup", {"keys": [{"user": "u1", "n": 1}], "batch": 1.5}, "batch is a whole number"),
        ("POST", "/v1/lookup", {"keys": [{"user": "u1", "n": 1}], "operator": True}, "operator is a whole number"),
        ("POST", "/v1/lookup", {"keys": [{"user": "u1", "n": "one"}]}, "'n'"),
    ],
)
def test_a_malformed_request_gets_a_400_naming_what_is_wrong(
    served: tuple[StateClient, Served], method: str, path: str, body: Any, words: str
) -> None:
    _, server = served
    status, answer = server.request(method, path.replace("{K}", key_param({"user": "u1", "n": 1})), body)
    assert status == 400 and isinstance(answer, dict) and words in answer["error"], (status, answer)


def test_well_formed_requests_still_answer(
    built: tuple[Path, dict[int, State]], served: tuple[StateClient, Served]
) -> None:
    """The checks above refuse only what is wrong: the same questions asked well answer as the input."""
    _, states = built
    _, server = served
    key = next(iter(sorted(states[1])))
    status, body = server.request("GET", f"/v1/state?key={key_param({'user': key[0], 'n': key[1]})}&batch=1&operator=0")
    assert status == 200 and body["found"] and body["value"] == as_rows(states[1])[key], body
    status, body = server.request("POST", "/v1/lookup", {"keys": [{"user": key[0], "n": key[1]}], "batch": 1})
    assert status == 200 and body["results"][0]["value"] == as_rows(states[1])[key], body


def known_keys(state: State, count: int) -> list[dict[str, Any]]:
    return [{"user": u, "n": n} for u, n in sorted(state)[:count]]


def test_a_lookup_asks_at_most_its_maximum_of_keys(
    built: tuple[Path, dict[int, State]], served: tuple[StateClient, Served]
) -> None:
    """8 keys answer (over HTTP and from StateClient), 9 are a 400 naming the 8 and saying to split
    them; a client left at its default takes 1,000 and refuses 1,001."""
    _, states = built
    client, server = served
    want = as_rows(states[BATCHES - 1])
    keys = known_keys(states[BATCHES - 1], 8)
    status, body = server.request("POST", "/v1/lookup", {"keys": keys})
    assert status == 200 and [r["value"] for r in body["results"]] == [want[k["user"], k["n"]] for k in keys], body
    assert [r.value for r in client.get_many(keys).results] == [want[k["user"], k["n"]] for k in keys]
    status, body = server.request("POST", "/v1/lookup", {"keys": [*keys, {"user": "u1", "n": 1}]})
    assert status == 400 and "9 keys" in body["error"] and "(8)" in body["error"] and "split" in body["error"], body
    with pytest.raises(QuestionError, match=r"\(8\): split the keys"):
        client.get_many([*keys, {"user": "u1", "n": 1}])
    with StateClient(str(built[0]), follow=False) as default:
        many = [{"user": f"nobody{i}", "n": i} for i in range(1001)]
        assert not any(r.found for r in default.get_many(many[:1000]).results)
        with pytest.raises(QuestionError, match=r"1,001 keys .*\(1,000\)"):
            default.get_many(many)
    with pytest.raises(ValueError, match="lookup_keys_max is at least 1"):
        StateClient(str(ROOT / "no-such-checkpoint"), lookup_keys_max=0)


BODY_MAX = 8 * 4096 + 64 * 1024  # the served client's 8 keys


def padded_lookup(keys: list[dict[str, Any]], size: int) -> bytes:
    """A lookup body of exactly `size` bytes: the keys, then spaces (JSON allows them after the value)."""
    text = json.dumps({"keys": keys}).encode()
    assert len(text) <= size
    return text + b" " * (size - len(text))


def lookup_head(framing: str) -> bytes:
    return f"POST /v1/lookup HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n{framing}\r\n\r\n".encode()


def test_a_lookup_body_over_its_size_is_refused_with_413_without_reading_the_rest(
    built: tuple[Path, dict[int, State]], served: tuple[StateClient, Served]
) -> None:
    """A body of the most bytes answers, with Content-Length or chunked. One byte more is a 413
    naming the limit: from Content-Length alone before any body byte is sent (2 GB announced, a few
    bytes sent), or chunked as soon as the body goes past it, the end of the body never sent. Each
    refusal closes the connection (else the server would read and discard the rest)."""
    _, states = built
    _, server = served
    keys = known_keys(states[BATCHES - 1], 2)
    values = [as_rows(states[BATCHES - 1])[k["user"], k["n"]] for k in keys]
    at_max = padded_lookup(keys, BODY_MAX)
    status, _, body = raw_exchange(server.port, lookup_head(f"Content-Length: {BODY_MAX}\r\nConnection: close"), at_max)
    assert status == 200 and [r["value"] for r in body["results"]] == values, body
    chunked = b"%x\r\n%b\r\n0\r\n\r\n" % (len(at_max), at_max)
    status, _, body = raw_exchange(server.port, lookup_head("Transfer-Encoding: chunked\r\nConnection: close"), chunked)
    assert status == 200 and [r["value"] for r in body["results"]] == values, body
    for announced, sent in ((BODY_MAX + 1, b""), (2_000_000_000, b'{"keys": [')):
        status, headers, body = raw_exchange(server.port, lookup_head(f"Content-Length: {announced}"), sent)
        assert status == 413 and headers.get("connection") == "close", (status, headers, body)
        assert f"the body is {announced:,} bytes" in body["error"] and "(98,304 bytes" in body["error"], body
        assert "split the keys" in body["error"], body
    over = padded_lookup(keys, BODY_MAX + 1)
    status, headers, body = raw_exchange(
        server.port, lookup_head("Transfer-Encoding: chunked"), b"%x\r\n%b\r\n" % (len(over), over)
    )
    assert status == 413 and headers.get("connection") == "close", (status, headers, body)
    assert "more than 98,304 bytes" in body["error"] and "split the keys" in body["error"], body


def test_a_key_in_a_query_string_holds_at_most_4096_characters(served: tuple[StateClient, Served]) -> None:
    """A key= of 4,096 characters of JSON answers (found nowhere); one more is a 414 naming the
    bound, unparsed: on /v1/state (answered outside Starlette) and /v1/scan."""
    _, server = served
    room = 4096 - len(json.dumps({"user": "", "n": 1}))
    for endpoint, advice in (("state", "POST /v1/lookup"), ("scan", "fewer key columns")):
        status, body = server.request("GET", f"/v1/{endpoint}?key={key_param({'user': 'x' * room, 'n': 1})}")
        assert status == 200 and not body.get("found") and not body.get("rows"), body
        status, body = server.request("GET", f"/v1/{endpoint}?key={key_param({'user': 'x' * (room + 1), 'n': 1})}")
        assert status == 414 and "key= is 4,097 characters" in body["error"] and "(4,096)" in body["error"], body
        assert advice in body["error"], body


def test_an_empty_token_file_and_an_unprotected_ipv6_any_address_are_refused(
    built: tuple[Path, dict[int, State]], tmp_path: Path
) -> None:
    missing = str(tmp_path / "no-such-checkpoint")  # refused before anything is opened
    for text in ("", " \n"):
        (tmp_path / "token").write_text(text)
        result = CliRunner().invoke(main, ["serve", missing, "--token-file", str(tmp_path / "token")])
        assert result.exit_code == 2 and "is empty" in result.output, result.output
    for host in ("::", "0:0:0:0:0:0:0:0", "0.0.0.0"):
        with pytest.raises(ServeConfigError, match="token"):
            check_binding(host, None)
        result = CliRunner().invoke(main, ["serve", missing, "--host", host], env={"PYSTATESTORE_SERVE_TOKEN": ""})
        assert result.exit_code == 1 and f"serving on {host} would let anyone" in result.output, result.output
    for host in ("::1", "127.0.0.1", "localhost"):
        check_binding(host, None)
    check_binding("::", "s3cret")


BLOCKER = '''
import os
import sys

BLOCKED = set(os.environ["TEST_NOT_INSTALLED"].split(","))


class NotInstalled:
    """Finds the blocked modules nowhere, as if the extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
'''


def run_pystatestore(args: list[str], tmp_path: Path, not_installed: str = "", **popen: Any) -> Any:
    """The `pystatestore` command (the installed entry point when the suite tests the wheel, else
    what that entry point runs, from this checkout) in a process of its own; `not_installed`: the
    modules it must find nowhere."""
    path = [str(tmp_path / "site")]
    (tmp_path / "site").mkdir(exist_ok=True)
    (tmp_path / "site" / "sitecustomize.py").write_text(BLOCKER)
    script = Path(sys.executable).parent / "pystatestore"
    if os.environ.get("PYSTATESTORE_TEST_INSTALLED") == "1" and script.exists():
        command = [str(script)]
    else:
        command = [sys.executable, "-c", "import sys; from pystatestore.tools.cli import main; sys.exit(main())"]
        path.append(str(ROOT / "python"))
    env = {k: v for k, v in os.environ.items() if k != "PYSTATESTORE_SERVE_TOKEN"}
    env["PYTHONPATH"] = os.pathsep.join([*path, *filter(None, [os.environ.get("PYTHONPATH")])])
    env["TEST_NOT_INSTALLED"] = not_installed
    if popen:
        return subprocess.Popen([*command, *args], env=env, **popen)
    return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("not_installed", "named"),
    [
        ("starlette,uvicorn,prometheus_client", "starlette, uvicorn, prometheus_client, which are"),
        ("prometheus_client", "prometheus_client, which is"),
        ("", None),  # the control: with the extra, the same command gets as far as the checkpoint
    ],
)
def test_serve_without_its_extra_says_what_to_install_before_opening_anything(
    tmp_path: Path, not_installed: str, named: str | None
) -> None:
    missing = tmp_path / "no-such-checkpoint"
    done = run_pystatestore(["serve", str(missing)], tmp_path, not_installed)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    if named is None:
        assert "there is no checkpoint directory here" in done.stderr, done.stderr
        return
    assert done.stderr.strip().splitlines() == [
        f"Error: the service needs {named} not installed: pip install 'pystatestore[serve]'"
    ], done.stderr
    assert not missing.exists()


def test_the_serve_command_pages_scans_and_caps_lookups_with_the_limits_it_was_given(
    built: tuple[Path, dict[int, State]], tmp_path: Path
) -> None:
    port = free_port()
    args = ["serve", str(built[0]), "--port", str(port), "--restore-in", "thread", "--scratch", str(tmp_path)]
    args += ["--scan-limit-default", "3", "--scan-limit-max", "7", "--lookup-keys-max", "4", "--poll-seconds", "5"]
    with open(tmp_path / "log", "wb") as log:
        process = run_pystatestore(args, tmp_path, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 60
        while True:
            assert process.poll() is None, (tmp_path / "log").read_text()
            try:
                if request(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the service did not start"
            time.sleep(0.1)
        status, page = request(port, "GET", "/v1/scan")
        assert status == 200 and len(page["rows"]) == 3 and page["cursor"], page
        status, body = request(port, "GET", "/v1/scan?limit=8")
        assert status == 400 and "(7)" in body["error"], body
        assert request(port, "GET", "/v1/scan?limit=7")[0] == 200
        keys = [{"user": "u1", "n": n} for n in range(5)]
        assert request(port, "POST", "/v1/lookup", {"keys": keys[:4]})[0] == 200
        status, body = request(port, "POST", "/v1/lookup", {"keys": keys})
        assert status == 400 and "(4)" in body["error"], body
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(30)
