"""Commit leases: what keeps garbage collection from deleting the files of a commit still in flight.

Files that no manifest references are orphans; GC deletes them once they are older than the grace
period. A commit whose uploads outlast the grace would lose its early files to another instance's GC,
so every commit attempt is protected by a lease:

- Every file an attempt writes carries the attempt's token in its path (`private/<v>-<token>/...`,
  `shared/<token>-<name>`), so GC can tell whose it is.
- An attempt that runs longer than a quarter of the grace writes `leases/<token>` and rewrites it
  every quarter of the grace while it runs. GC keeps every file of an attempt whose lease was
  written within the grace period.
- Before it publishes its manifest, the attempt checks that it never went half a grace period without
  renewing (measured on its own clock from its start): an attempt that was frozen (GC pause, stopped
  process, stalled storage) may have lost files, so it fails instead of publishing and Spark retries.
- An attempt that builds on a version older than the newest (Spark re-runs an older batch) writes its
  lease at once, naming that base version: GC keeps a leased base like a retained version, with the
  chain and files the new version will reference, however far below the retained ones it is.

The token functions here are pure, so retention stays a pure function of a listing.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable

from .errors import CheckpointMissingError, StateStoreError, StoreConfigError
from .remote import RemoteFile, RemoteStore

LEASE_DIR = "leases"
MIN_GRACE_SECONDS = 10.0
DEFAULT_ORPHAN_GRACE_SECONDS = 600.0  # orphanGraceSeconds when the conf is unset
_TOKEN = r"[0-9a-f]{32}"
_PRIVATE = re.compile(rf"^(?:private|changelog)/\d+-({_TOKEN})(?:[/.]|$)")
_SHARED = re.compile(rf"^shared/({_TOKEN})(?:[-.]|$)")
_LEASE = re.compile(rf"^{LEASE_DIR}/({_TOKEN})$")
log = logging.getLogger("pystatestore.leases")

Clock = Callable[[], float]


class LeaseLostError(StateStoreError):
    """The attempt went too long without renewing its lease; its files may have been collected."""

    advice = (
        "Nothing was published for this attempt; Spark retries the task. If this repeats, the commit "
        "is stalling (storage or GC pauses): raise spark.sql.streaming.stateStore.pystatestore."
        "orphanGraceSeconds."
    )


def attempt_token_of(path: str) -> str | None:
    """The token of the attempt that wrote a store-relative data or lease path, if it has one."""
    for pattern in (_PRIVATE, _SHARED, _LEASE):
        m = pattern.match(path)
        if m:
            return m.group(1)
    return None


def live_attempts(listing: Iterable[RemoteFile], *, now: float, grace_seconds: float) -> frozenset[str]:
    """Tokens of attempts whose lease was written within the grace period (or at an unknown time)."""
    return frozenset(
        token
        for f in listing
        if f.path.startswith(LEASE_DIR + "/")
        and (token := attempt_token_of(f.path)) is not None
        and (f.mtime is None or now - f.mtime <= grace_seconds)
    )


def leased_bases(bodies: Iterable[bytes], versions: Iterable[int]) -> frozenset[int]:
    """The base versions named by the bodies of live leases (see `CommitLease.pin_base`). A lease
    without a base (a commit on the newest version) names none: it protects its attempt's files
    only. A body that cannot be parsed (damaged, or written by a release this one cannot read) may
    name any base, so it pins every one of `versions`: no manifest goes while it lives."""
    found = set()
    for body in bodies:
        try:
            doc = json.loads(body)
            if not isinstance(doc, dict):
                raise ValueError("not a JSON object")
        except ValueError:
            return frozenset(versions)
        base = doc.get("base_version")
        if isinstance(base, int) and not isinstance(base, bool) and base >= 0:
            found.add(base)
    return frozenset(found)


def is_lease(path: str) -> bool:
    """`leases/<token>` itself, not a temporary of its publication."""
    return _LEASE.match(path) is not None


class LeaseUnreadableError(StateStoreError):
    """A live lease could not be read: what it pins is unknown, so garbage collection deletes nothing."""

    advice = (
        "Garbage collection deleted nothing this run and tries again at the next maintenance. If this "
        "repeats, check the permissions of the store's leases/ directory and the health of its storage."
    )


def read_leased_bases(
    remote: RemoteStore, leases: Iterable[RemoteFile], *, now: float, grace_seconds: float, versions: Iterable[int]
) -> frozenset[int]:
    """`leased_bases` of the live leases among `leases` (a listing of leases/). Raises
    LeaseUnreadableError when a live lease cannot be read (not merely gone): dropping its pin could
    delete the base its commit is building on."""
    bodies = []
    for f in leases:
        if not is_lease(f.path) or (f.mtime is not None and now - f.mtime > grace_seconds):
            continue  # a temporary of a publication, or expired: its attempt is dead or will not publish
        try:
            bodies.append(remote.read_bytes(f.path).to_pybytes())
        except CheckpointMissingError:
            continue  # removed since the listing: its attempt has ended
        except OSError as e:
            raise LeaseUnreadableError(
                f"a live commit lease cannot be read ({e})", store=remote.uri, file=f.path
            ) from None
    return leased_bases(bodies, versions)


def validate_grace(value: str | float, *, store: str) -> float:
    """The orphan grace period in seconds; refuses values that would let GC outrun commits."""
    try:
        grace = float(value)
    except (TypeError, ValueError):
        raise StoreConfigError(f"orphanGraceSeconds={value!r} is not a number", store=store) from None
    if not grace == grace or grace in (float("inf"), float("-inf")) or grace < MIN_GRACE_SECONDS:
        raise StoreConfigError(
            f"orphanGraceSeconds={value!r} is out of range: it must be at least {MIN_GRACE_SECONDS:g} seconds "
            "(files of commits in flight on other executors are protected for that long between lease renewals)",
            store=store,
        )
    return grace


class CommitLease:
    """The lease of one commit attempt. Use as a context manager around everything it writes."""

    def __init__(
        self, remote: RemoteStore, token: str, version: int, *, grace_seconds: float, clock: Clock = time.time
    ) -> None:
        self.remote = remote
        self.token = token
        self.version = version
        self.grace = grace_seconds
        self.clock = clock
        self.path = f"{LEASE_DIR}/{token}"
        self._lock = threading.Lock()
        self._renewing = threading.Lock()
        self._closed = False
        self._started = 0.0
        self._last_renewal = 0.0
        self._longest_gap = 0.0
        self._written = False
        self.base_version: int | None = None

    def __enter__(self) -> CommitLease:
        self._started = self._last_renewal = self.clock()
        _RENEWALS.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _RENEWALS.remove(self)
        with self._renewing:  # waits for a renewal in flight; none starts after this
            self._closed = True
        if self._written:
            try:
                self.remote.delete(self.path)
            except OSError as e:  # GC removes expired leases; this is only tidiness
                log.debug("could not remove lease %s of %s: %s", self.path, self.remote.uri, e)

    @property
    def renewal_interval(self) -> float:
        return self.grace / 4

    def pin_base(self, base_version: int) -> None:
        """Writes the lease now, naming `base_version`: GC keeps that version's chain and files while
        the lease lives. Raises OSError when the lease cannot be written (the commit must not go on
        unprotected)."""
        self.base_version = base_version
        with self._renewing:
            self.remote.publish(self.path, self._body(), durable=False)  # see `renew`
        with self._lock:
            self._last_renewal = self.clock()
            self._written = True

    def _body(self) -> bytes:
        doc: dict[str, object] = {"version": self.version, "token": self.token, "at": self.clock()}
        if self.base_version is not None:
            doc["base_version"] = self.base_version
        return json.dumps(doc).encode()

    def renew(self) -> None:
        with self._renewing:
            if self._closed:  # the attempt has ended: writing now would leave a stale lease
                return
            body = self._body()
            try:
                # Published whole (rename or one PUT), never truncated then written: garbage
                # collection reading it meanwhile sees the old body or the new, never a part. Not
                # fsynced: a lease matters only while its attempt runs, and a power cut ends the
                # attempt; one it tears pins every version until it expires (`leased_bases`).
                self.remote.publish(self.path, body, durable=False)
            except OSError as e:
                log.warning("could not renew lease %s of %s: %s", self.path, self.remote.uri, e)
                return
        with self._lock:
            now = self.clock()
            self._longest_gap = max(self._longest_gap, now - self._last_renewal)
            self._last_renewal = now
            self._written = True

    def check_before_publish(self) -> None:
        """Raises LeaseLostError unless the attempt was never half a grace period without renewal."""
        with self._lock:
            gap = max(self._longest_gap, self.clock() - self._last_renewal)
        if gap >= self.grace / 2:
            raise LeaseLostError(
                f"this commit went {gap:.1f} s without renewing its lease (limit {self.grace / 2:.1f} s); "
                "another instance's garbage collection may have removed its files",
                store=self.remote.uri,
                version=self.version,
                file=self.path,
            )


class _LeaseRenewals:
    """One daemon thread renews every live lease of the process when it is due. Nearly every commit
    ends within a quarter of the grace and never renews, so entering a lease costs a dict insert,
    not a thread started and joined per commit. Renewals run outside the scheduler's lock, one
    after another: a lease stalled on its storage delays the others, which share that storage."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._due: dict[CommitLease, float] = {}
        self._thread: threading.Thread | None = None

    def add(self, lease: CommitLease) -> None:
        with self._cond:
            self._due[lease] = time.monotonic() + lease.renewal_interval
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lease-renewals", daemon=True)
                self._thread.start()
            self._cond.notify()

    def remove(self, lease: CommitLease) -> None:
        with self._cond:
            self._due.pop(lease, None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                due = [lease for lease, at in self._due.items() if at <= now]
                for lease in due:
                    self._due[lease] = now + lease.renewal_interval
                if not due:
                    self._cond.wait(timeout=min(self._due.values(), default=now + 60.0) - now)
                    continue
            for lease in due:
                lease.renew()


_RENEWALS = _LeaseRenewals()
