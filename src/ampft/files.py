"""The one file hasher: checkpoint manifests (`checkpointing`) and the data cache keys (`data.load`) use it."""

from __future__ import annotations

import hashlib
import os

BLOCK = 8 << 20  # bytes read at a time


def sha256(path: str | os.PathLike, sync: bool = False) -> str:
    """SHA-256 (hex) of a file's content, streamed in 8 MiB blocks; hashlib releases the GIL, so files hash in
    parallel threads. SHA-256: with SHA extensions the fastest of hashlib's on x86 and ARM (docs/architecture.md).
    `sync`: also fsync the file (a checkpoint's files, before its manifest is written)."""
    h = hashlib.sha256()
    buf = memoryview(bytearray(BLOCK))
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(buf[:n])
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()
