"""``launcher=slurm`` asks sbatch for ``trainer.devices`` GPUs and tasks per node: only a count
works there, and every other form Lightning takes is refused in one line before anything runs."""

from __future__ import annotations

import pytest

from laptrain.config.check import ConfigError, check_composed, compose_argv
from tests.conftest import CONF
from tests.in_process import train_here

SLURM = ["hardware=cpu", "trainer=ddp_cpu", "trainer.strategy=ddp", "launcher=slurm"]


def compose(overrides: list[str]):
    return compose_argv(["train.py", "-m", *overrides], str(CONF))


@pytest.mark.parametrize("devices", ["auto", "-1", "[0,1]", "'0,1'", "0"])
def test_launcher_slurm_refuses_devices_that_are_not_a_count(devices):
    cfg = compose([*SLURM, f"trainer.devices={devices}"])
    with pytest.raises(ConfigError) as err:
        check_composed(cfg)
    line = str(err.value)
    assert "\n" not in line
    assert "launcher=slurm" in line and "set trainer.devices=<count>" in line


def test_launcher_slurm_takes_a_count_and_other_launchers_take_every_form():
    check_composed(compose([*SLURM, "trainer.devices=4"]))
    check_composed(compose(["hardware=cpu", "trainer=ddp_cpu", "trainer.devices=auto"]))


@pytest.mark.slow  # ~5 s; the refusal of each form is tested in process above
def test_train_py_exits_2_naming_the_count(tmp_path):
    done = train_here(["-m", *SLURM, "trainer.devices=-1"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: launcher=slurm asks SLURM for trainer.devices GPUs and tasks per node, which "
        "takes a count, not trainer.devices=-1: set trainer.devices=<count>, e.g. "
        "trainer.devices=4 (SLURM picks the GPUs)"
    ]
    assert not (tmp_path / "outputs").exists()
