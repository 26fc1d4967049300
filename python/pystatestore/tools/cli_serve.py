"""`pystatestore serve`: the running query's state over HTTP (queryable/server.py), following its commit log."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ..queryable.limits import MAX_LOOKUP_KEYS
from ..queryable.paging import DEFAULT_SCAN_LIMIT, MAX_SCAN_LIMIT
from ..store.errors import StateStoreError
from .cli_output import err


@click.command()
@click.argument("checkpoint")
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=int, default=8765, show_default=True)
@click.option(
    "--token-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A file holding the token every request must send (Authorization: Bearer TOKEN); "
    "required unless --host is loopback. Or set PYSTATESTORE_SERVE_TOKEN.",
)
@click.option(
    "--poll-seconds", type=float, default=0.25, show_default=True, help="How often the commit log is checked."
)
@click.option("--scratch", default=None, help="Where restored versions are kept (default: a temporary directory).")
@click.option(
    "--restore-in",
    type=click.Choice(["process", "thread"]),
    default="process",
    show_default=True,
    help="Where newly committed versions are restored: a child process (answers never wait behind a "
    "restore for Python's GIL) or a thread of the service.",
)
@click.option(
    "--scan-limit-default",
    type=click.IntRange(min=1),
    default=DEFAULT_SCAN_LIMIT,
    show_default=True,
    help="Rows a /v1/scan page holds when it names no limit.",
)
@click.option(
    "--scan-limit-max",
    type=click.IntRange(min=1),
    default=MAX_SCAN_LIMIT,
    show_default=True,
    help="The most rows a /v1/scan page may ask for (a 400 above it): a bigger scan pages on with its cursor.",
)
@click.option(
    "--lookup-keys-max",
    type=click.IntRange(min=1),
    default=MAX_LOOKUP_KEYS,
    show_default=True,
    help="The most keys one /v1/lookup may ask (a 400 above it; its body may hold 4 KiB a key plus 64 KiB, "
    "a 413 above): more keys are split over several lookups.",
)
def serve(
    checkpoint: str,
    host: str,
    port: int,
    token_file: Path | None,
    poll_seconds: float,
    scratch: str | None,
    restore_in: str,
    scan_limit_default: int,
    scan_limit_max: int,
    lookup_keys_max: int,
) -> None:
    """Answer point lookups, multi-key lookups and scans of a running query's state over HTTP, each
    from one committed batch it names, following the query as it commits. Never writes to the
    checkpoint."""
    from ..queryable.server import TOKEN_ENV, ServeConfigError, check_binding, missing_server_modules
    from ..queryable.server import serve as run_server

    # Before anything is opened: the server imports these only once it starts answering.
    missing = missing_server_modules()
    if missing:
        raise click.ClickException(
            f"the service needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} not installed: "
            "pip install 'pystatestore[serve]'"
        )
    if scan_limit_default > scan_limit_max:
        raise click.BadParameter(
            f"{scan_limit_default} is above --scan-limit-max {scan_limit_max}", param_hint="--scan-limit-default"
        )
    token = token_file.read_text().strip() if token_file is not None else os.environ.get(TOKEN_ENV) or None
    if token_file is not None and not token:
        raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
    try:
        check_binding(host, token)
    except ServeConfigError as e:
        raise click.ClickException(str(e)) from None
    from ..queryable.client import StateClient

    try:
        client = StateClient(
            checkpoint,
            poll_seconds=poll_seconds,
            scratch=scratch,
            restore_in=restore_in,
            scan_limit_default=scan_limit_default,
            scan_limit_max=scan_limit_max,
            lookup_keys_max=lookup_keys_max,
        )
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    err.print(f"serving {client.uri} (batch {client.batch}) on http://{host}:{port}", markup=False)
    try:
        run_server(client, host, port, token)
    finally:
        client.close()
