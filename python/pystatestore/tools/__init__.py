"""Offline tools over a checkpoint: a Spark checkpoint's layout (checkpoint.py) and its stores read
(store_reader.py), decoding Spark's rows (unsafe_row.py, spark_hash.py), key lookup, inspection and
reports, and the `pystatestore` command (cli.py). They read through the storage layer and never
run a worker.
"""
