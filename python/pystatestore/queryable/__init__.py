"""Queryable state: a service that runs beside a streaming query and answers questions about its
state while it runs, read from its checkpoint (DESIGN §9). `StateClient` (client.py) answers
in-process; `pystatestore serve` (server.py) over HTTP."""

from .client import Answer, BatchGoneError, Lookup, QuestionError, Scan, StateClient

__all__ = ["Answer", "BatchGoneError", "Lookup", "QuestionError", "Scan", "StateClient"]
