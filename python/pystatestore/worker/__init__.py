"""The process the JVM shim talks to: `python -m pystatestore.worker` (process.py) serves
StoreService (service.py) over Py4J, with the fault seam (faults.py) the fault tests drive.

Nothing is imported here: the process installs its import guard before pyarrow loads (process.py).
"""
