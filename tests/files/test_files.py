"""The one file hasher (ampft.files.sha256) behind checkpoint manifests and data cache keys."""

from __future__ import annotations

import hashlib
import os

from ampft import checkpointing, files
from ampft.files import file_digest


def test_sha256_matches_hashlib_across_block_boundaries(tmp_path):
    data = os.urandom(files.BLOCK + 3)
    (tmp_path / "a.bin").write_bytes(data)
    (tmp_path / "empty").write_bytes(b"")
    want = hashlib.sha256(data).hexdigest()
    assert files.sha256(tmp_path / "a.bin") == files.sha256(tmp_path / "a.bin", sync=True) == want
    assert checkpointing.digests(tmp_path, ["a.bin", "empty"]) == {"a.bin": want,
                                                                   "empty": hashlib.sha256(b"").hexdigest()}
    assert file_digest(tmp_path / "a.bin") == f"{len(data)}-{want[:20]}"  # the data cache key, as before
