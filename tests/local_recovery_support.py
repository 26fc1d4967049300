"""Damaging local recovery copies the way a bad disk would."""

from __future__ import annotations

from pathlib import Path

from pystatestore.store.local_recovery import MARKER


def damage_one_sst_in_place(recovery_root: Path) -> Path:
    """Flips a byte of the largest SST in the newest copy of one store. In place, like a bad disk
    block: the damage reaches every hard link of the file, so no other copy can stand in for it."""
    copy = max(recovery_root.rglob(MARKER), key=lambda p: int(p.parent.name.split("-")[0])).parent
    sst = max(copy.glob("*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as f:
        f.seek(sst.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0x01]))
    return sst
