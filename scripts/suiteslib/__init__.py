"""pyspark_suites.py's own modules: `sources` (where PySpark's transformWithState test modules come
from, and the overlay they run from), `record` (what a child records of each test) and `report`
(the report of a run directory)."""
