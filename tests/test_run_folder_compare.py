"""`laptrain runs compare` and `laptrain runs clean` through the CLI, on two tiny real runs."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from laptrain.commands import cli
from laptrain.run_folder.clean import folder_bytes
from tests.conftest import TINY, write_texts
from tests.in_process import train_here

COMMON = ["hardware=cpu", "model=tiny_classifier", "data=text_csv", "trainer.val_check_interval=2"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``outputs/a`` (lr 0.001, 4 steps) and ``outputs/b`` (lr 0.002, 6 steps), made once."""
    home = tmp_path_factory.mktemp("compare")
    data = f"data.files.train={write_texts(home / 'texts.csv')}"
    for name, differ in (
        ("a", ["trainer.max_steps=4"]),
        ("b", ["trainer.max_steps=6", "model.optimizer.lr=0.002"]),
    ):
        done = train_here([*COMMON, *TINY, data, *differ, f"run_name={name}"], cwd=home)
        assert done.returncode == 0, done.stderr[-3000:]
    return home / "outputs"


def table(lines: list[str], first: int) -> list[list[str]]:
    """The cells of the Markdown table starting at ``lines[first]`` (its separator left out)."""
    rows = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        if not line.startswith("|-"):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", head
    return struct.unpack(">II", head[16:24])


def test_compare_prints_the_differing_keys_the_metrics_and_writes_the_curves(
    outputs, tmp_path, capsys, monkeypatch
):
    out = tmp_path / "plots" / "ab.png"
    # a run by its name, another by its folder
    argv = ["runs", "--root", str(outputs), "compare", "a", str(outputs / "b"), "--out", str(out)]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "config: the keys that differ"
    config = table(lines, 1)
    assert config[0] == ["key", "a", "b"]
    assert sorted(config[1:]) == [
        ["model.optimizer.lr", "0.001", "0.002"],
        ["run_name", "a", "b"],
        ["trainer.max_steps", "4", "6"],
    ]
    start = lines.index("", 1) + 1
    metrics = {row[0]: row[1:] for row in table(lines, start)}
    assert metrics[""] == ["a", "b"]
    assert metrics["status"] == ["done", "done"] and metrics["step"] == ["4", "6"]
    shown = (
        "best val/acc",
        "val/loss",
        "test/acc",
        "samples/s",
        "peak RSS (MB)",
        "wall time (fit)",
    )
    for row in shown:
        assert len(metrics[row]) == 2 and "—" not in metrics[row], row
    assert lines[-1] == f"validation curves: {out}"
    width, height = png_size(out)
    assert width > 100 and height > 100

    monkeypatch.chdir(tmp_path)  # the default plot lands in the current folder
    assert cli.main(["runs", "compare", "a", "b", "--root", str(outputs)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "validation curves: runs_compare.png"
    png_size(tmp_path / "runs_compare.png")


def test_compare_refuses_an_unknown_run_and_a_single_run(outputs, capsys):
    assert cli.main(["runs", "compare", "a", "nope", "--root", str(outputs)]) == 2
    assert capsys.readouterr().err.startswith("error: no run folder nope")
    assert cli.main(["runs", "compare", "a", "--root", str(outputs)]) == 2
    assert "two runs or more" in capsys.readouterr().err


@pytest.fixture
def copies(outputs: Path, tmp_path: Path) -> Path:
    """A fresh ``outputs/`` holding copies of both runs, for clean to remove."""
    root = tmp_path / "outputs"
    for name in ("a", "b"):
        shutil.copytree(outputs / name, root / name, symlinks=True)
    return root


def test_clean_dry_run_removes_nothing_then_clean_removes_one_run(copies, capsys):
    size = folder_bytes(copies / "a")
    assert cli.main(["runs", "clean", "a", "--dry-run", "--root", str(copies)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("a: done, step 4, ") and out[0].endswith(": would be removed")
    assert f"({size:,} bytes) from 1 run" in out[-1] and "nothing removed" in out[-1]
    assert (copies / "a" / "report.json").is_file()

    assert cli.main(["runs", "clean", "a", "--root", str(copies)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith(": removed") and out[-1].startswith("freed ")
    assert f"({size:,} bytes) from 1 run" in out[-1] and size > 100_000
    assert not (copies / "a").exists() and (copies / "b" / "report.json").is_file()


def test_clean_refuses_a_live_run_and_removes_nothing(copies, capsys):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                from laptrain.run_folder.lock import hold_run_folder
                import time
                hold_run_folder({str(copies / "a")!r}, ["python", "train.py", "run_name=a"])
                print("held", flush=True); time.sleep(30)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert cli.main(["runs", "clean", "b", "a", "--root", str(copies)]) == 2
        captured = capsys.readouterr()
        [line] = captured.err.splitlines()
        assert f"pid {holder.pid} " in line and line.endswith("; nothing removed"), line
        assert captured.out == ""
    finally:
        holder.kill()
        holder.wait()
    assert (copies / "a" / "report.json").is_file() and (copies / "b" / "report.json").is_file()


def test_clean_refuses_what_is_not_a_run_under_the_root(copies, tmp_path, capsys):
    (copies / "notes").mkdir()
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(copies / "b", elsewhere)
    (copies / "link").symlink_to(elsewhere)  # a run folder, but out of outputs/
    for name in ("notes", "link", str(elsewhere), "../elsewhere", "."):
        assert cli.main(["runs", "clean", name, "--root", str(copies)]) == 2, name
        [line] = capsys.readouterr().err.splitlines()
        assert line.startswith("error: ") and line.endswith("; nothing removed"), line
    assert (elsewhere / "report.json").is_file() and (copies / "link").is_symlink()
    assert sorted(p.name for p in copies.iterdir()) == ["a", "b", "link", "notes"]
