"""benchmarks/grpo_vs_trl.py --smoke: laptrain's GRPO and TRL's GRPOTrainer + peft each train a tiny
offline Llama for a few steps in their own process; the table has both arms with positive figures
and, each arm generating every completion to full length, the same ratio in completion tokens/s
as in steps/s (tiny sizes: no goal is asserted). Skipped where trl is not installed (``pip install trl``)."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run


@pytest.mark.slow  # four processes of the tiny Llama
def test_grpo_vs_trl_smoke_prints_both_arms(tmp_path) -> None:
    pytest.importorskip("trl", reason="pip install trl")
    out = run("grpo_vs_trl.py", ["--smoke", "--steps", "2"], tmp_path)
    assert "load average" in out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for arm in ("laptrain", "TRL GRPOTrainer + peft"):
        tokens, steps = (float(rows[arm].split("|")[i]) for i in (2, 3))
        assert tokens > 0 and steps > 0
    tokens, steps = (rows["laptrain / TRL"].split("|")[i].split("x")[0] for i in (2, 3))
    assert tokens.strip() == steps.strip()  # the same completion tokens per step in both arms
