"""benchmarks/device_smoke.py on CPU at tiny sizes: the table a Mac or GPU user pastes into a report."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from laptrain.devices import families
from laptrain.devices.families import FAMILIES, Family

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_smoke.py"


def smoke_main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("device_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def row(out: str, family: str) -> list[str]:
    line = next(s for s in out.splitlines() if s.startswith(f"| {family} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")][1:]


def test_cpu_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke_main(["--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: cpu - ")
    assert "torch " in out and "lightning " in out and "OS: " in out
    header = next(s for s in out.splitlines() if s.startswith("| family |"))
    assert header == "| family | 32-true | bf16-mixed | 64-true | 16-mixed |"
    for family in ("classifier", "trm"):
        cells = row(out, family)
        assert cells[0].startswith("ok (") and cells[2].startswith("ok ("), cells
        assert cells[3].startswith("refused: hardware.precision=16-mixed"), cells
    assert row(out, "trm")[1].startswith("refused: TRM runs float32 on cpu")
    assert "failed" not in out


def test_one_failing_cell_does_not_stop_the_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(seed: int, steps: int):
        raise RuntimeError("boom on this device\nsecond line")

    monkeypatch.setitem(FAMILIES, "broken", Family("broken", build, FAMILIES["trm"].predict))
    assert families.FAMILIES["broken"].name == "broken"
    code = smoke_main(["--families", "broken,trm", "--precisions", "32-true", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert row(out, "broken") == ["failed: RuntimeError: boom on this device"]
    assert row(out, "trm")[0].startswith("ok (")
    assert "### broken / 32-true" in out and "second line" in out  # the traceback follows


def test_unknown_family_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        smoke_main(["--families", "nope"])
    assert "unknown families ['nope']" in capsys.readouterr().err
