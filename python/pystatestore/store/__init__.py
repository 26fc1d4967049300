"""The durable format and the storage engine: manifests, remote storage, the shared-file registry,
retention and GC, leases, changelog segments, local recovery copies, and the state backends.

This layer knows nothing of the process the JVM talks to (`pystatestore.worker`) or of the offline
tools (`pystatestore.tools`): it imports neither (tests/test_layering.py keeps it so).
"""
