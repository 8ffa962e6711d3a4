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
