"""The stores' CRC-32 (zlib-ng) gives exactly the values of the standard library's zlib, which
every existing checkpoint's manifests were written with, whole and file by file across read chunks."""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import pytest

from pystatestore.store.checksums import checksum, file_checksum


def zlib_text(data: bytes) -> str:  # the referee: the standard library, not the code under test
    return f"crc32:{zlib.crc32(data) & 0xFFFFFFFF:08x}"


@pytest.mark.parametrize("size", [0, 1, 4095, (1 << 20) - 1, 1 << 20, (3 << 20) + 17])
def test_checksums_match_zlib_in_memory_and_across_file_chunks(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    path = tmp_path / "f.sst"
    path.write_bytes(data)
    assert checksum(data) == zlib_text(data)
    assert checksum(memoryview(data)) == zlib_text(data)
    assert file_checksum(path) == (size, zlib_text(data))


def test_a_flipped_byte_changes_the_file_checksum(tmp_path: Path) -> None:
    data = bytearray(os.urandom((2 << 20) + 5))
    path = tmp_path / "f.sst"
    path.write_bytes(bytes(data))
    before = file_checksum(path)
    data[(1 << 20) + 3] ^= 0x01  # in the second read chunk
    path.write_bytes(bytes(data))
    assert file_checksum(path) != before
    assert file_checksum(path)[1] == zlib_text(bytes(data))
