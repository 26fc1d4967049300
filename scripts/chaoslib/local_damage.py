"""Damage to this host's local recovery copies, as the fault matrix draws it (chaos.py): a flipped
byte in, or the deletion of, one file of a copy while the query is stopped.

The damage stays local (decision 0048). A copy's files are hard links of the local DB's, and after
a restore from a checkpoint on the same filesystem (the matrix puts its checkpoint and the local
copies on one disk) some are hard links of the checkpoint's own SSTs. A byte flipped in place would
land in the checkpoint too: not the fault modelled (a damaged copy beside a sound checkpoint), and
one no restore could get around. So a flip breaks the link first: the file's bytes, one of them
flipped, go into a new file renamed over the copy's name, and every other name of the old file
(the checkpoint's, other copies', the local DB's) keeps its bytes. A deletion removes one name."""

from __future__ import annotations

import os
import random
import stat
import uuid
from pathlib import Path


def damage_local_copies(local_dir: Path, how: str, rnd: random.Random) -> str:
    """Damages one file (drawn by `rnd`) under `local_dir`: `how` is "delete" or "flip". Returns
    what it did, for the run's notes."""
    files = sorted(p for p in local_dir.rglob("*") if p.is_file())
    if not files:
        return "no local copy to damage"
    victim = rnd.choice(files)
    if how == "delete":
        victim.unlink()
    else:
        flip_one_byte(victim, rnd)
    return f"{how} {victim.relative_to(local_dir)}"


def flip_one_byte(path: Path, rnd: random.Random) -> None:
    """Replaces `path` with a file of its bytes with one of them flipped (an empty file stays as it
    is), written under a temporary name beside it and renamed over it: `path` gets a file of its
    own, and the file it named is left as it was under any other name."""
    data = bytearray(path.read_bytes())
    if not data:
        return
    data[rnd.randrange(len(data))] ^= 0x5A
    tmp = path.with_name(f".{path.name}.damaged-{uuid.uuid4().hex}")  # draws what it drew before, no more
    with open(tmp, "xb") as out:
        out.write(data)
    os.chmod(tmp, stat.S_IMODE(path.stat().st_mode))
    os.replace(tmp, path)
