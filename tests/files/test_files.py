"""The one file hasher (ampft.files.sha256) behind checkpoint manifests and data cache keys, and the one Markdown
table of the reports."""

from __future__ import annotations

import hashlib
import os

import pytest

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


def test_markdown_table_renders_as_a_commonmark_table_with_its_cells_and_alignment():
    """A CommonMark parser with the GFM table rule is the oracle: a `|` inside a cell stays in its cell."""
    markdown_it = pytest.importorskip("markdown_it")
    lines = files.markdown_table(["arm", "value"], [["a|b", 1.5], ["`x`", None]], align="lr")
    tokens = markdown_it.MarkdownIt().enable("table").parse("\n".join(lines))
    cells = [t.content for t in tokens if t.type == "inline"]
    assert cells == ["arm", "value", "a|b", "1.5", "`x`", "None"]
    aligns = [t.attrGet("style") for t in tokens if t.type in ("th_open", "td_open")]
    assert aligns == [None, "text-align:right"] * 3
