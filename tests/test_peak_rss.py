"""A process's peak memory is its own, not the peak of the process that started it."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

CHILD = (
    "import sys; sys.path.insert(0, sys.argv[1]);"
    "from laptrain.hardware.peak_rss import process_peak_bytes;"
    "print(process_peak_bytes())"
)


def test_a_child_of_a_large_process_reads_its_own_peak():
    held = bytearray(512 * 2**20)
    held[::4096] = b"\x01" * len(held[::4096])  # touch every page: 512 MiB resident here
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "src")], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 256 * 2**20, float(done.stdout) / 2**20  # not this process's peak
    del held
