"""The preflight's claim, as the README states it: its estimate is within 0.85-1.15 of the peak a
real training step reaches (benchmarks/preflight.py, one case per model kind, each in a fresh
process so the peak RSS is the case's own)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("case", ["bert,8,128,0", "llama,8,256,1"])
def test_the_estimate_is_within_the_band_of_the_measured_peak(case):
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "preflight.py"), "--case", case],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    ratio = result["estimate"] / result["measured"]
    assert 0.85 <= ratio <= 1.15, (case, ratio, result["parts"])
