"""``--json`` on ``laptrain runs`` and ``laptrain why`` (``preflight --json``: tests/test_preflight_cli.py):
one JSON document on stdout, nothing else there, stable keys."""

from __future__ import annotations

import json

from laptrain.commands import cli
from tests.test_why import steps, write_run

RUN_KEYS = {"name", "folder", "status", "step", "best_metric", "best_score", "evaluated", "command"}


def test_runs_json_lists_each_run_with_stable_keys(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["runs", "--json"]) == 0  # no outputs/ yet: an empty list, still JSON
    assert json.loads(capsys.readouterr().out) == {"root": "outputs", "runs": []}
    report = {
        "run": {"status": "finished", "global_step": 40},
        "checkpoint": {"monitor": "val/acc", "best_score": 0.875},
    }
    write_run(tmp_path / "outputs" / "a", {}, report)
    (tmp_path / "outputs" / "a" / ".hydra").mkdir()
    (tmp_path / "outputs" / "a" / ".hydra" / "overrides.yaml").write_text("- run_name=a\n")
    assert cli.main(["runs", "--json"]) == 0
    out = capsys.readouterr().out
    listing = json.loads(out)  # the whole of stdout is one document
    [run] = listing["runs"]
    assert set(run) == RUN_KEYS
    assert (run["name"], run["status"], run["step"]) == ("a", "done", 40)
    assert (run["best_metric"], run["best_score"]) == ("val/acc", 0.875)
    assert run["command"] == "python train.py run_name=a"


def test_why_json_gives_the_findings_the_text_prints(tmp_path, capsys) -> None:
    loss = [(s, 1.0 / (1 + s) if s < 30 else float("nan")) for s in steps(2, 40)]
    folder = write_run(
        tmp_path / "run",
        {"train/loss": loss},
        {"run": {"status": "interrupted (NonFiniteLoss)", "global_step": 30}},
    )
    assert cli.main(["why", str(folder)]) == 0
    text = capsys.readouterr().out.splitlines()
    assert cli.main(["why", str(folder), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert set(found) == {"run", "status", "step", "header", "findings"}
    assert (found["status"], found["step"]) == ("interrupted (NonFiniteLoss)", 30)
    assert [found["header"], *(f["line"] for f in found["findings"])] == text
    assert found["findings"][0]["kind"] == "nonfinite"
    for finding in found["findings"]:
        assert set(finding) == {"kind", "step", "value", "text", "advice", "line"}
