"""A local S3 server (moto's) for the tests, with credentials in the environment as a user's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def local_s3() -> Iterator[dict[str, str]]:
    """Starts the server and yields pyarrow's S3 options for it (region, scheme, endpoint)."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update(AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test")
    try:
        host, port = server.get_host_and_port()
        yield {"region": "us-east-1", "scheme": "http", "endpoint_override": f"{host}:{port}"}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()
