"""Queryable state: a running query's state read while it runs, from its checkpoint (DESIGN §9).
`StateClient` (client.py) answers in-process; `pystatestore serve` (server.py) over HTTP."""

from .client import Answer, BatchGoneError, Lookup, QuestionError, Scan, StateClient

__all__ = ["Answer", "BatchGoneError", "Lookup", "QuestionError", "Scan", "StateClient"]
