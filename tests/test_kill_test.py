"""benchmarks/kill_test.py at 4 rounds (SIGKILL, one Ctrl-C, two Ctrl-C, SIGTERM): nothing corrupt,
nothing lost to a clean stop, a single Ctrl-C saves and the run goes on, and the final weights are
those of a run never interrupted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kill_test  # noqa: E402


def check_rounds(rounds: list[kill_test.Round]) -> None:
    for r in rounds:
        assert r.corrupt == 0 and r.rerun_ok and r.identical, r
        assert not any(n.startswith("hung") for n in r.notes), r
        if "ended before the signal" in r.notes:
            continue
        if r.signal == "SIGINT":  # saved at the next step boundary, then trained to the end
            assert r.exit_code == 0 and 0 <= r.saved - r.reached <= 4, r
        elif r.signal != "SIGKILL":  # a clean stop saves the step it stopped at
            assert r.exit_code in (130, 143) and r.reached == r.saved, r


@pytest.mark.slow
def test_four_interrupted_runs_lose_nothing(tmp_path, capsys):
    rounds = kill_test.main(["--runs", "4", "--seed", "1", "--work", str(tmp_path)])
    assert [r.signal for r in rounds] == ["SIGKILL", "SIGINT", "SIGINT x2", "SIGTERM"]
    check_rounds(rounds)
    assert "ended before the signal" not in rounds[1].notes  # seed 1: the Ctrl-C lands at step 5
    assert 0 <= rounds[0].reached - rounds[0].saved <= 5  # SIGKILL: at most the interval
    out = capsys.readouterr().out
    assert "| SIGKILL" in out and "| SIGINT once (saves, goes on) | 1 | 1 | 0 |" in out


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["workers", "ddp"])
def test_four_rounds_signalled_to_the_process_group_lose_nothing(tmp_path, setup):
    """2 persistent workers with accumulation 4, or 2 DDP processes; every process of the run
    gets the signal (Ctrl-C in a terminal): no hang, the clean stops lose no step, a single Ctrl-C
    saves on every rank at the same step and the run goes on, and the reruns end with the
    uninterrupted run's weights."""
    args = ["--runs", "4", "--seed", "1", "--work", str(tmp_path), "--setup", setup, "--group"]
    check_rounds(kill_test.main(args))
