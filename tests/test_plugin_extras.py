"""A group option whose Hydra plugin comes from a missing extra is refused in one line, exit 2."""

from __future__ import annotations

import textwrap

import pytest

from laptrain.config.plugin_extras import MissingExtra, check_plugin_extras, plugins_of
from tests.conftest import CONF, run_train

MISSING = 'from laptrain\'s [sweep] extra, which is not installed: pip install -e ".[sweep]"'


def test_options_name_the_plugins_their_defaults_select():
    assert plugins_of("launcher=slurm", CONF) == ["hydra/launcher/submitit_slurm"]
    assert plugins_of("hparams_search=optuna", CONF) == ["hydra/sweeper/laptrain_optuna"]
    assert plugins_of("hydra/launcher=submitit_local", CONF) == ["hydra/launcher/submitit_local"]
    assert plugins_of("model=tiny_classifier", CONF) == []
    assert plugins_of("trainer.max_steps=3", CONF) == []


@pytest.mark.parametrize(
    ("override", "package"),
    [
        ("launcher=slurm", "hydra-submitit-launcher"),
        ("+launcher=slurm", "hydra-submitit-launcher"),
        ("hparams_search=optuna", "optuna"),
        ("hydra/launcher=submitit_slurm", "hydra-submitit-launcher"),
    ],
)
def test_a_missing_plugin_names_its_extra_and_the_install(override, package):
    with pytest.raises(MissingExtra) as err:
        check_plugin_extras(["model=tiny_classifier", override], CONF, is_installed=lambda m: False)
    assert str(err.value) == f"{override} needs {package}, {MISSING}"


def test_installed_plugins_and_plain_options_pass():
    check_plugin_extras(["launcher=slurm", "hparams_search=optuna"], CONF, lambda m: True)
    check_plugin_extras(["model=trm_sudoku", "data=sudoku"], CONF, lambda m: False)


# Hides the [sweep] extra's packages from train.py, as in an install without it.
HIDE_SWEEP = textwrap.dedent(
    """
    import importlib.abc, sys

    class HideSweep(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "optuna" or name.startswith(("optuna.", "hydra_plugins.hydra_submitit")):
                raise ModuleNotFoundError(name)
            return None

    sys.meta_path.insert(0, HideSweep())
    """
)


@pytest.mark.parametrize(
    ("args", "package"),
    [(["launcher=slurm"], "hydra-submitit-launcher"), (["-m", "hparams_search=optuna"], "optuna")],
)
def test_train_py_without_the_sweep_extra_says_which_extra_in_one_line(tmp_path, args, package):
    (tmp_path / "hide").mkdir()
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE_SWEEP)
    done = run_train(
        ["hardware=cpu", *args], tmp_path, env={"PYTHONPATH": str(tmp_path / "hide")}, timeout=60
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [f"error: {args[-1]} needs {package}, {MISSING}"]
    assert not (tmp_path / "outputs").exists()
