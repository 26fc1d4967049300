"""`pystatestore serve`: the running query's state over HTTP (queryable/server.py), following its commit log."""

from __future__ import annotations

import os
from pathlib import Path

import click

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
def serve(
    checkpoint: str,
    host: str,
    port: int,
    token_file: Path | None,
    poll_seconds: float,
    scratch: str | None,
    restore_in: str,
) -> None:
    """Answer point lookups, multi-key lookups and scans of a running query's state over HTTP, each
    from one committed batch it names, following the query as it commits. Never writes to the
    checkpoint."""
    try:
        from ..queryable.server import TOKEN_ENV, ServeConfigError, check_binding
        from ..queryable.server import serve as run_server
    except ImportError as e:  # pragma: no cover - depends on the install
        raise click.ClickException(
            f"the service needs its HTTP libraries ({e.name} is missing): pip install 'pystatestore[serve]'"
        ) from None
    token = token_file.read_text().strip() if token_file is not None else os.environ.get(TOKEN_ENV) or None
    if token_file is not None and not token:
        raise click.BadParameter(f"{token_file} is empty", param_hint="--token-file")
    try:
        check_binding(host, token)
    except ServeConfigError as e:
        raise click.ClickException(str(e)) from None
    from ..queryable.client import StateClient

    try:
        client = StateClient(checkpoint, poll_seconds=poll_seconds, scratch=scratch, restore_in=restore_in)
    except StateStoreError as e:
        raise click.ClickException(str(e)) from None
    err.print(f"serving {client.uri} (batch {client.batch}) on http://{host}:{port}", markup=False)
    try:
        run_server(client, host, port, token)
    finally:
        client.close()
