"""The `pystatestore` command (cli.py) and what its commands compute as plain data: inspection,
verification, garbage-collection dry runs, disk usage, state rows, HTML reports, and the state
rewrites (`migrate`, `repartition`). They read through `reading` and the storage layer and never run
a worker; `serve` starts the queryable-state service (`queryable`).
"""
