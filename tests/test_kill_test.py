"""benchmarks/kill_test.py at 3 rounds (one SIGKILL, one SIGINT, one SIGTERM): nothing corrupt,
nothing lost to a clean stop, the final weights those of a run never interrupted."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import kill_test  # noqa: E402


@pytest.mark.slow
def test_three_interrupted_runs_lose_nothing(tmp_path, capsys):
    rounds = kill_test.main(["--runs", "3", "--seed", "1", "--work", str(tmp_path)])
    assert [r.signal for r in rounds] == ["SIGKILL", "SIGINT", "SIGTERM"]
    for r in rounds:
        assert r.corrupt == 0 and r.rerun_ok, r
        assert r.identical, r
    for r in rounds[1:]:  # a clean stop saves the step it stopped at
        assert r.exit_code in (130, 143) and r.reached == r.saved, r
    assert 0 <= rounds[0].reached - rounds[0].saved <= 5  # SIGKILL: at most the interval
    assert "| SIGKILL" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.parametrize("setup", ["workers", "ddp"])
def test_three_rounds_signalled_to_the_process_group_lose_nothing(tmp_path, setup):
    """2 persistent workers with accumulation 4, or 2 DDP processes; every process of the run
    gets the signal (Ctrl-C in a terminal): no hang, the clean stops lose no step, and the reruns
    end with the uninterrupted run's weights."""
    args = ["--runs", "3", "--seed", "1", "--work", str(tmp_path), "--setup", setup, "--group"]
    rounds = kill_test.main(args)
    for r in rounds:
        assert r.corrupt == 0 and r.rerun_ok and r.identical, r
        assert not any(n.startswith("hung") for n in r.notes), r
    for r in rounds[1:]:
        if "ended before the signal" not in r.notes:
            assert r.exit_code in (130, 143) and r.reached == r.saved, r
