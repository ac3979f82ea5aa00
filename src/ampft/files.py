"""The one file hasher (`sha256`), the content digest of a data file (`file_digest`), the one atomic, durable
file write (`write_atomic`) and the one Markdown table (`markdown_table`): checkpoints, data cache keys, metrics,
sweep summaries and the benchmark's and estimate's reports use them."""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path

BLOCK = 8 << 20  # bytes read at a time


def sha256(path: str | os.PathLike, sync: bool = False) -> str:
    """SHA-256 (hex) of a file's content in 8 MiB blocks (why SHA-256: docs/architecture.md); `sync`: also fsync
    the file (a checkpoint's files, before its manifest is written)."""
    h = hashlib.sha256()
    buf = memoryview(bytearray(BLOCK))
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            h.update(buf[:n])
        if sync:
            os.fsync(f.fileno())
    return h.hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """`<size>-<sha256 prefix>` of a file's content, the key of caches of data read from it; memoized by (path,
    size, mtime, ctime, inode): ctime changes with any rewrite, even one restoring the mtime, so never stale."""
    st = os.stat(path)
    return _digest(os.path.abspath(path), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, *stamp: int) -> str:
    return f"{size}-{sha256(path)[:20]}"


def write_atomic(path: str | os.PathLike, text: str) -> None:
    """Replace `path` with `text` via a fsynced `<name>.tmp` and a rename: a crash leaves the old file or the
    new one, never a torn one."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside folder `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def markdown_table(header: list, rows: list[list], align: str = "") -> list[str]:
    """A Markdown table's lines; align: a letter per column, l (the default) or r (right-aligned). A `|` in a
    cell is escaped: it would split the cell in two."""
    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |"
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align.ljust(len(header), "l"))
    return [line(header), rule, *map(line, rows)]
