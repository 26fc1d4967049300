"""`pystatestore serve`'s requests, without Spark: scans paged with a cursor under a capped limit,
lookups under a cap on their keys and their body's bytes, keys in query strings under a length cap,
and malformed requests, on a checkpoint laid out by hand (tests/serve_checkpoint.py; the referee
is the input). The command itself: tests/test_serve_command.py."""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from pystatestore.queryable import BatchGoneError, QuestionError, StateClient
from pystatestore.tools.cli import main
from serve_checkpoint import BATCHES, State, as_rows, write_checkpoint
from serve_support import Served, key_param, raw_exchange

ROOT = Path(__file__).resolve().parent.parent


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
