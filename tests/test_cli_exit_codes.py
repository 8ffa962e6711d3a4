"""One exit code per outcome for train.py and every ``laptrain`` command (docs/lightning.md,
"Interrupts and exit codes"): 2 bad input, 65 a NaN stop, 69 does not fit, 75 paused, 128 + signal."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from laptrain.callbacks.nonfinite_guard import NonFiniteLoss
from laptrain.commands import cli
from laptrain.commands.doctor import Check, Report, _guard
from laptrain.exit_codes import DOES_NOT_FIT_EXIT, NONFINITE_EXIT, PAUSED_EXIT, error_exit_code
from laptrain.families.lora.tools import BaseTooLarge
from laptrain.preflight.batch import PreflightError
from tests.conftest import ROOT, TINY, write_texts
from tests.in_process import train_here


def test_the_codes_are_sysexits_distinct_and_in_the_docs_table() -> None:
    assert (NONFINITE_EXIT, DOES_NOT_FIT_EXIT, PAUSED_EXIT) == (65, 69, 75)  # sysexits.h
    codes = {0, 2, NONFINITE_EXIT, DOES_NOT_FIT_EXIT, PAUSED_EXIT, 130, 143}
    assert len(codes) == 7
    text = (ROOT / "docs" / "lightning.md").read_text()
    table = text[text.index("| how the run ended | exit status |") :].split("\n\n")[0]
    rows = {int(m) for m in re.findall(r"\| (\d+)(?: \(|$| \|)", table, re.M)}
    assert codes <= rows | {0}, table
    for name in ("EX_DATAERR", "EX_UNAVAILABLE", "EX_TEMPFAIL"):
        assert name in table


def test_each_error_maps_to_its_code() -> None:
    assert error_exit_code(PreflightError("this job does not fit")) == DOES_NOT_FIT_EXIT
    assert error_exit_code(BaseTooLarge("the base does not fit")) == DOES_NOT_FIT_EXIT
    assert error_exit_code(NonFiniteLoss("loss is nan at global step 3")) == NONFINITE_EXIT
    assert error_exit_code(ValueError("bad key")) == 2
    assert error_exit_code(OSError("no such file")) == 2


def test_doctor_exits_does_not_fit_only_when_every_failure_is_memory() -> None:
    ok = Check("machine", True, "fine")

    def out_of_memory() -> Check:
        raise PreflightError("this job does not fit even at micro batch 1")

    memory = _guard("training", out_of_memory)
    assert memory.memory and not memory.ok and memory.detail.startswith("PreflightError: ")
    assert Report([ok]).exit_code == 0
    assert Report([ok, memory]).exit_code == DOES_NOT_FIT_EXIT
    assert Report([memory, Check("disk", False, "0.1 GiB free")]).exit_code == 1
    assert '"exit_code": 69' in Report([ok, memory]).to_json()


def test_bench_of_a_job_the_preflight_refuses_exits_does_not_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    csv = write_texts(tmp_path / "texts.csv", rows=120)
    argv = [*TINY, "data=text_csv", f"data.files.train={csv}", "hardware=cpu"]
    argv += ["hardware.memory_budget_gb=0.01", "--steps", "2"]
    assert cli.main(["bench", *argv]) == DOES_NOT_FIT_EXIT
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert line.startswith("error: ") and "does not fit" in line, line


def test_train_py_of_a_job_the_preflight_refuses_exits_does_not_fit(tmp_path: Path) -> None:
    """train.py itself (not only bench): one error line, exit 69, no checkpoint written."""
    csv = write_texts(tmp_path / "texts.csv", rows=120)
    args = [*TINY, "data=text_csv", f"data.files.train={csv}", "hardware=cpu"]
    done = train_here([*args, "hardware.memory_budget_gb=0.01", "run_name=big"], tmp_path)
    assert done.returncode == DOES_NOT_FIT_EXIT, done.stderr[-3000:]
    [line] = [line for line in done.stderr.splitlines() if line.strip()][-1:]
    assert line.startswith("error: ") and "does not fit" in line, line
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.rglob("*.ckpt"))
