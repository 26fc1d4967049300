"""The shared-file registry (Flink's SharedStateRegistry, modern semantics; DESIGN §4).

Entries are keyed by physical (remote) path and remember the version that created the file and the
newest version that uses it. `last_used` only grows, registering twice is idempotent, and a
placeholder (reuse of an already uploaded file) may only name an existing entry. The registry holds
no state of its own between runs: it is rebuilt from the retained manifests whenever it is needed,
so a crash in the middle of garbage collection loses nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass
class RegistryEntry:
    path: str
    created_by: int
    last_used: int


class UnknownSharedFileError(ValueError):
    """A placeholder named a file no earlier version registered."""


class SharedStateRegistry:
    def __init__(self) -> None:
        self._entries: dict[str, RegistryEntry] = {}

    def register(self, path: str, version: int, *, placeholder: bool = False) -> RegistryEntry:
        entry = self._entries.get(path)
        if entry is None:
            if placeholder:
                raise UnknownSharedFileError(f"version {version} reuses {path}, which no earlier version uploaded")
            entry = self._entries[path] = RegistryEntry(path, version, version)
        else:
            entry.created_by = min(entry.created_by, version)
            entry.last_used = max(entry.last_used, version)
        return entry

    @classmethod
    def from_manifests(cls, files_by_version: Mapping[int, Iterable[str]]) -> SharedStateRegistry:
        """Replays every version's file list in version order."""
        registry = cls()
        for version in sorted(files_by_version):
            for path in files_by_version[version]:
                registry.register(path, version)
        return registry

    def get(self, path: str) -> RegistryEntry | None:
        return self._entries.get(path)

    def __contains__(self, path: object) -> bool:
        return path in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def unused_before(self, lowest_retained: int) -> list[str]:
        """Files whose newest user is older than the lowest retained version: safe to delete."""
        return sorted(e.path for e in self._entries.values() if e.last_used < lowest_retained)
