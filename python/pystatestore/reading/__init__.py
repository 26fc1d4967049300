"""Reading a checkpoint without Spark or a JVM, shared by the offline tools and the queryable-state
service: Spark's checkpoint layout (checkpoint.py), a store opened read-only (store_reader.py),
Spark's rows decoded (unsafe_row.py, decoded.py) and hashed to their partition (spark_hash.py),
key lookups (key_lookup.py), transformWithState's column families (families.py). Reads through the
storage layer only; never writes.
"""
