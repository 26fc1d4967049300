"""Offline tools over a checkpoint: reading a Spark checkpoint's stores (checkpoint.py), decoding
Spark's rows (unsafe_row.py, spark_hash.py), key lookup, inspection and reports, and the
`pystatestore` command (cli.py). They read through the storage layer and never run a worker.
"""
