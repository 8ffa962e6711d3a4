"""laptrain eval RUN --tasks: lm-evaluation-harness accuracy of a LoRA run, adapter vs base, the
same as lm_eval's own CLI on the merged export; the MPS cross-check's decision; the bad-input lines
(issue 50, items 4 and 5)."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from laptrain.commands.cli import main
from laptrain.families.lora.causal_lm import CausalLMLoRAModule
from laptrain.families.lora.eval_tasks import TASKS_DIR
from laptrain.families.lora.harness import scores_on
from laptrain.run_folder.listing import run_state, runs_table
from tests.test_causal_lm_lora import (
    _one_thread,  # noqa: F401 - module fixture
    base,  # noqa: F401 - module fixture
    tokenizer,  # noqa: F401 - module fixture
)


@pytest.fixture(scope="module")
def lora_run(tokenizer, base, tmp_path_factory):  # noqa: F811
    """A run folder whose adapter (r 8, B drawn at random) moves the base's answers."""
    pytest.importorskip("lm_eval", reason="lm-eval is not installed: pip install '.[eval]'")
    run = tmp_path_factory.mktemp("run")
    (run / "run_info.json").write_text("{}")
    (run / "report.md").write_text("# Run report\n\nstatus: done\n")
    torch.manual_seed(0)
    module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8})
    with torch.no_grad():
        for name, weight in module.named_parameters():
            if "lora_B" in name:
                weight.normal_(0, 0.3)
    module.export(run / "adapter")
    return run


def test_tasks_json_matches_lm_eval_cli_on_the_merged_export(
    lora_run, tmp_path, capsys, monkeypatch
):
    argv = ["eval", str(lora_run), "--tasks", "stdlib_mc", "--limit", "20", "--base", "--json"]
    assert main(argv) == 0
    scores = json.loads(capsys.readouterr().out)  # stdout is the JSON and nothing else
    assert set(scores) == {"stdlib_mc"} and set(scores["stdlib_mc"]) == {"adapter", "base"}
    assert all(0 <= acc <= 1 for acc in scores["stdlib_mc"].values())
    assert scores["stdlib_mc"]["adapter"] != scores["stdlib_mc"]["base"]
    written = json.loads((lora_run / "eval" / "lm_eval.json").read_text())
    assert written == {"limit": 20, "tasks": scores}
    shown = run_state(lora_run)  # laptrain runs' row and the report show the same figures
    adapter = f"stdlib_mc {scores['stdlib_mc']['adapter']:.1%}"
    assert adapter in runs_table([shown], lora_run.parent)
    report = (lora_run / "report.md").read_text()
    assert report.startswith("# Run report") and f"| {adapter.split()[1]} |" in report

    assert main(["export", str(lora_run), "--out", str(tmp_path / "merged")]) == 0
    out = tmp_path / "lm_eval_out"
    # `lm_eval ...`: its CLI's own entry, in this process (lm_eval is imported already)
    from lm_eval.__main__ import cli_evaluate

    monkeypatch.setattr(sys, "argv", [
        "lm_eval", "--model", "hf", "--model_args",
        f"pretrained={tmp_path / 'merged'},dtype=float32", "--tasks", "stdlib_mc",
        "--include_path", str(TASKS_DIR), "--limit", "20", "--device", "cpu",
        "--output_path", str(out)],
    )  # fmt: skip
    monkeypatch.chdir(tmp_path)
    cli_evaluate()
    [results] = out.rglob("results_*.json")
    theirs = json.loads(results.read_text())["results"]["stdlib_mc"]["acc,none"]
    assert abs(theirs - scores["stdlib_mc"]["adapter"]) <= 0.005


def one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    assert captured.out == ""
    [line] = captured.err.strip().splitlines()
    return line


def test_unknown_task_names_close_ones(lora_run, capsys):
    assert main(["eval", str(lora_run), "--tasks", "stdlib_mcq"]) == 2
    line = one_line_error(capsys)
    assert "stdlib_mcq" in line and "close names: stdlib_mc" in line


def test_limit_0_and_data_with_tasks_are_one_line(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--tasks", "stdlib_mc", "--limit", "0"]) == 2
    assert "--limit 0" in one_line_error(capsys)
    argv = ["eval", str(tmp_path), "--tasks", "stdlib_mc", "--data", "rows.jsonl"]
    assert main(argv) == 2
    assert "--data and --tasks" in one_line_error(capsys)


class StandIn:
    """A model that only records the device it is moved to."""

    device = "cpu"

    def to(self, device: str) -> StandIn:
        self.device = device
        return self


def test_mps_scores_after_a_cpu_cross_check_and_stops_on_a_difference():
    model, calls = StandIn(), []

    def score(on_mps: float):
        def run(limit):
            calls.append((model.device, limit))
            return {"stdlib_mc": {"adapter": on_mps if model.device == "mps" else 0.5}}

        return run

    assert scores_on("mps", model, score(0.505), 200) == {"stdlib_mc": {"adapter": 0.505}}
    assert calls == [("cpu", 50), ("mps", 50), ("mps", 200)]
    model.device, calls[:] = "cpu", []
    with pytest.raises(ValueError, match=r"--tasks stdlib_mc: adapter scores 52\.0% on mps"):
        scores_on("mps", model, score(0.52), None)
    assert calls == [("cpu", 50), ("mps", 50)]  # stopped before the whole evaluation
    model.device = "cpu"
    assert scores_on("cpu", model, score(0.9), 10) == {"stdlib_mc": {"adapter": 0.5}}
