"""The speed benchmarks run and print their tables (tiny sizes: no timing is asserted here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, write_texts

BENCH = ROOT / "benchmarks"


def run(script: str, args: list[str], cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=cwd,
        env={**os.environ, "LAPTRAIN_CACHE": str(cwd / "cache")},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_overhead_prints_the_ratio_and_each_callbacks_cost(tmp_path: Path) -> None:
    csv = write_texts(tmp_path / "texts.csv", rows=120)
    job = [*TINY, "hardware=cpu", "data=text_csv", f"data.files.train={csv}"]
    out = run("overhead.py", ["--steps", "3", "--repeats", "1", *job], tmp_path)
    assert "load average" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert rows["plain loop"].split("|")[3].strip() == "1.000"
    assert "laptrain (default callbacks + logger)" in rows
    for callback in ("NonFiniteGuard", "RunReport"):
        assert callback in rows  # each default callback whose per-batch hooks run has its own row
    # a guard that cannot act (hardware=cpu has no guards) is not built: it costs nothing
    assert "PowerGuard" not in rows and "ThermalGuard" not in rows
    assert any(name.endswith("ProgressBar") for name in rows)
    assert "laptrain without the progress bar" in rows and "laptrain without the logger" in rows


@pytest.mark.slow
def test_run_all_smoke_prints_the_four_tables(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # Hugging Face's Trainer needs it (the [dev] extra)
    out = run("run_all.py", ["--smoke"], tmp_path)
    assert "failed" not in out
    for script in ("overhead.py", "vs_hf.py", "startup.py", "cache.py"):
        assert f"## {script}" in out
    assert out.count("machine:") == 4
    assert "| HF group_by_length |" in out
    assert "total to the first optimizer step" in out
    assert "| second (cache warm) |" in out


@pytest.mark.slow  # ~28 s; the fast suite stays under 10 minutes on 2 cores
def test_real_lora_smoke_prints_the_three_arms_and_the_mfu_line(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # Hugging Face's Trainer needs it (the [dev] extra)
    out = run("real_lora.py", ["--smoke"], tmp_path)
    assert "load average" in out and "fp32 matmul peak:" in out
    table = out.split("\n\n")[1].splitlines()  # the throughput table, after the header lines
    assert "MFU" in table[0] and len(table) == 5
    goals = {"laptrain": "| - |", "bare peft loop": "| ≥ 0.97 |"}
    goals["HF Trainer + peft (group_by_length)"] = "| ≥ 1.1 |"
    for row, (arm, goal) in zip(table[2:], goals.items(), strict=True):
        assert row.startswith(f"| {arm} |") and goal in row
    assert "trained on the same batches" in out  # laptrain's loader fed the bare loop
    # laptrain's arm runs hardware=cpu's malloc_keep_freed; the others always glibc's defaults
    assert "bare peft loop off, HF Trainer + peft (group_by_length) off" in out
