"""benchmarks/real_minilm.py runs its three arms and prints the table (tiny model: no timing)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_benchmarks import run


@pytest.mark.slow  # ~25 s; benchmarks/real_lora.py's smoke stays in the fast suite
def test_real_minilm_smoke_prints_the_three_arms(tmp_path: Path) -> None:
    pytest.importorskip("accelerate")  # Hugging Face's Trainer needs it (the [dev] extra)
    out = run("real_minilm.py", ["--smoke"], tmp_path)
    assert "load average" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert rows["laptrain"].split("|")[3].strip() == "1.000"
    assert "≥ 0.97" in rows["plain loop"]
    assert "≥ 1.1" in rows["HF group_by_length"]
    for arm in ("laptrain", "plain loop", "HF group_by_length"):
        samples_per_s = float(rows[arm].split("|")[2])
        assert samples_per_s > 0
    assert "laptrain − plain loop, step by step" in out
    assert "NonFiniteGuard" in rows  # the table of laptrain's callbacks' time in their hooks
