"""bench_soak.py's own modules: `report`, the report of a run from its raw figures."""
