"""The one file hasher (`sha256`) and the content digest of a data file (`file_digest`): checkpoint manifests
(`checkpointing`) and the data cache keys (`data`) use them."""

from __future__ import annotations

import functools
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


def file_digest(path: str | os.PathLike) -> str:
    """`<size>-<sha256 prefix>` of a file's content: what caches of data read from it are keyed by.

    Hashing is cheap next to reading and tokenizing (docs/benchmarks/microbench.md#hashing-data-files).
    Memoized per process by (path, size, mtime, ctime, inode): ctime changes with any rewrite, even one
    that restores the mtime, so a memo is never stale."""
    st = os.stat(path)
    return _digest(os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, *stamp: int) -> str:
    return f"{size}-{sha256(path)[:20]}"
