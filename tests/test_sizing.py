"""`model.size=auto` is resolved on the command line, like hardware=auto, so --cfg job shows it."""

from laptrain.families.trm.sizing import resolve_size_argv
from tests.conftest import CONF

YAML = str(CONF / "model" / "trm_sudoku.yaml")


def test_size_auto_is_rewritten_by_memory_and_explained():
    argv = ["train.py", "model=trm_sudoku", "model.size=auto", "hardware.memory_budget_gb=8"]
    args, lines = resolve_size_argv(argv, YAML)
    assert args[:2] == argv[:2] and args[3] == argv[3]
    assert args[2] == "model.size=ram_8gb"
    assert "RAM class picks 'ram_8gb'" in lines[0] and "chose 'ram_8gb'" in lines[-1]
    # 16 GB: field note 002's class is ram_16gb, but its ~2 h estimate overruns the 60-minute budget
    args16, lines16 = resolve_size_argv([*argv[:3], "model.memory_gb=16"], YAML)
    assert "picks 'ram_16gb'" in lines16[0] and args16[2] == "model.size=ram_8gb"
    args16, _ = resolve_size_argv(
        [*argv[:3], "model.memory_gb=16", "model.time_budget_min=600"], YAML
    )
    assert args16[2] == "model.size=ram_16gb"


def test_other_command_lines_are_left_alone():
    argv = ["train.py", "model=trm_sudoku", "model.size=tiny"]
    assert resolve_size_argv(argv, YAML) == (argv, [])


def test_size_auto_is_replaced_in_place_with_flags_around_it():
    argv = [
        "train.py",
        "-m",
        "model=trm_sudoku",
        "model.size=auto",
        "model.memory_gb=8",
        "--cfg",
        "job",
    ]
    args, _ = resolve_size_argv(argv, YAML)
    assert args == [*argv[:3], "model.size=ram_8gb", *argv[4:]]
    # an option's value is not an override: `--config-name model.size=auto` is left alone
    odd = ["train.py", "--config-name", "model.size=auto"]
    assert resolve_size_argv(odd, YAML) == (odd, [])


def test_a_16_gb_mac_s_own_ram_gets_the_16_gb_class(monkeypatch):
    """Without a number on the command line the machine's RAM decides: a 16 GB Mac has 16 x 2^30
    bytes, which read as 10^9-byte GB was 17.2 and picked the 32 GB class."""
    import psutil

    monkeypatch.setattr(
        psutil, "virtual_memory", lambda: type("Memory", (), {"total": 16 * 2**30})()
    )
    _, lines = resolve_size_argv(["train.py", "model=trm_sudoku", "model.size=auto"], YAML)
    assert "16.0 GB RAM" in lines[0] and "picks 'ram_16gb'" in lines[0], lines[0]
