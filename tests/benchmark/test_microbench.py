"""scripts/microbench.py, the instrument behind the fast-path defaults, runs as documented (docs/fast-paths.md)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_the_precision_microbenchmark_measures_each_arm_and_names_the_cpu():
    proc = subprocess.run([sys.executable, "scripts/microbench.py", "precision", "--reps", "1", "--steps", "1",
                           "--batch", "2"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"CPU: .+; half-precision flags: .+; torch threads \d+; batch 2 x \d+", proc.stdout)
    rows = re.findall(r"^\| (fp32|bf16|fp16) \| (\d+) \| [\d ,]+ \| ([\d.]+)x \|$", proc.stdout, re.M)
    assert {arm for arm, _, _ in rows} == {"fp32", "bf16", "fp16"}
    assert all(int(ms) > 0 for _, ms, _ in rows) and dict((a, r) for a, _, r in rows)["fp32"] == "1.00"
