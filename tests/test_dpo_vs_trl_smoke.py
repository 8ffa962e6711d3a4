"""benchmarks/dpo_vs_trl.py --smoke: laptrain, TRL's DPOTrainer + peft and TRL with
group_by_length each train a tiny offline Llama for a few steps in their own process, and the
held-out reward accuracy of both is printed side by side (tiny sizes: no timing is asserted).
Skipped where trl is not installed (``pip install trl``: a benchmark-only install)."""

from __future__ import annotations

import pytest

from tests.test_benchmarks import run


@pytest.mark.slow  # ~50 s with a cold cache: five processes; the fast suite stays under 10 minutes
def test_dpo_vs_trl_smoke_prints_both_tables(tmp_path) -> None:
    pytest.importorskip("trl", reason="pip install trl")
    out = run("dpo_vs_trl.py", ["--smoke"], tmp_path)
    assert "load average" in out and "versions: trl " in out
    assert "token-identical pairs: " in out  # both arms trained on the same rows
    throughput, accuracy = out.split("Held-out reward accuracy after 3 steps")
    lines = throughput.splitlines()
    rows = {line.split("|")[1].strip(): line for line in lines if line.startswith("| ")}
    assert rows["laptrain"].split("|")[4].strip() == "1.000"  # the throughput table's ratio
    for arm in ("TRL DPOTrainer + peft", "TRL DPOTrainer + peft (group_by_length)"):
        assert "| ≥ 1.1 |" in rows[arm]
    table = [line for line in accuracy.splitlines() if line.startswith("| ")]
    assert len(table) == 3  # header, laptrain, TRL
    assert table[1].startswith("| laptrain | `python train.py`")
    assert table[2].startswith("| TRL DPOTrainer + peft | DPOTrainer.train")
    assert "laptrain − TRL: " in accuracy and "within noise" in accuracy
