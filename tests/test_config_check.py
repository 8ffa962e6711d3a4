"""The pre-run check: every config option binds to its constructor; bad input is one line."""

from __future__ import annotations

import shutil

import pytest

from laptrain.config.check import ConfigError, check_composed, check_config, compose_argv
from tests.conftest import CONF
from tests.in_process import train_here
from tests.new_project import laptrain_options


def precheck(argv: list[str], conf_dir: str):
    """The launch's config check: ``argv`` composed as Hydra will, then every ``_target_``."""
    cfg = compose_argv(argv, conf_dir)
    check_composed(cfg)
    return cfg


def every_option() -> list[tuple[str, str]]:
    """laptrain's own options (a user's presets compose with their own data: tests/new_project.py)."""
    return [
        (group.name, option)
        for group in sorted(p for p in CONF.iterdir() if p.is_dir())
        for option in laptrain_options(CONF, group.name)
    ]


def test_every_option_of_every_group_composes_and_binds_to_its_constructors():
    assert len({g for g, _ in every_option()}) >= 10  # hardware, model, data, callbacks, trainer...
    for group, option in every_option():
        precheck(["train.py", f"{group}={option}"], str(CONF))


def test_a_misspelt_key_in_a_yaml_file_is_named_with_the_closest_argument(tmp_path):
    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    path = conf / "callbacks" / "model_checkpoint.yaml"
    path.write_text(path.read_text().replace("save_top_k", "save_topk"))
    with pytest.raises(ConfigError) as err:
        precheck(["train.py"], str(conf))
    assert "callbacks.model_checkpoint.save_topk is not an argument of" in str(err.value)
    assert "did you mean callbacks.model_checkpoint.save_top_k?" in str(err.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("model.optimizer.lr=abc", "model.optimizer.lr='abc' must be float"),
        ("hardware=m9", "no hardware=m9: choose one of auto, cpu"),
        ("data.files.nope=1", "to add a new key write +data.files.nope=1"),
        ("hardware.batch_sze=3", "did you mean hardware.batch_size?"),
        ("trainer.max_epochs=-5", "trainer.max_epochs=-5 must be an int >= -1"),
        ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches=0 must be"),
        ("model.optimizer.lr=1e-4,3e-4", "add -m to sweep"),
        (
            "model.gradient_checkpointing=maybe",
            "model.gradient_checkpointing='maybe' must be bool or 'auto'",
        ),
        ("run_name=../../x", "run_name='../../x' must name one folder under outputs/"),
        ("run_name=a/b", "run_name='a/b' must name one folder under outputs/"),
        ("run_name=", "run_name='' must name one folder under outputs/"),
        ("run_name=..", "set run_name=<name>"),
        ("trainer.use_distributed_sampler=true", "does not fit laptrain's data modules"),
        ("hardware.memory_fraction=nan", "hardware.memory_fraction=nan must be a number in (0, 1]"),
        ("hardware.memory_fraction=inf", "hardware.memory_fraction=inf must be a number in (0, 1]"),
        ("hardware.memory_fraction=0", "e.g. hardware.memory_fraction=0.8"),
        ("hardware.memory_fraction=1.5", "hardware.memory_fraction=1.5 must be"),
        ("hardware.memory_fraction=abc", "hardware.memory_fraction=abc must be"),
        (
            "hardware.memory_budget_gb=nan",
            "hardware.memory_budget_gb=nan must be a number of GiB (2^30 bytes) > 0",
        ),
        ("hardware.memory_budget_gb=inf", "hardware.memory_budget_gb=inf must be"),
        ("hardware.memory_budget_gb=-2", "or null to take hardware.memory_fraction"),
        ("hardware.torch_threads=-1", "hardware.torch_threads=-1 must be an int >= 1, or null"),
        ("hardware.torch_threads=2.5", "hardware.torch_threads=2.5 must be an int >= 1"),
        ("hardware.malloc_keep_freed=yes", "hardware.malloc_keep_freed=yes must be true or false"),
        ("hardware.malloc_keep_freed=1", "e.g. hardware.malloc_keep_freed=false"),
    ],
)
def test_bad_input_is_one_line_naming_the_key_and_the_fix(override, expected):
    with pytest.raises(ConfigError) as err:
        precheck(["train.py", override], str(CONF))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "override",
    [
        "hardware.memory_fraction=1",
        "hardware.memory_budget_gb=null",
        "hardware.memory_budget_gb=0.5",
        "hardware.torch_threads=null",
        "hardware.torch_threads=0",  # falsy: torch's default, as laptrain.job.plan reads it
        "hardware.torch_threads=3",
        "hardware.malloc_keep_freed=false",
    ],
)
def test_good_hardware_numbers_pass(override):
    precheck(["train.py", "hardware=cpu", override], str(CONF))


def test_all_problems_are_gathered_into_one_message():
    with pytest.raises(ConfigError) as err:
        precheck(["train.py", "model.optimizer.lr=abc", "trainer.max_steps=-3"], str(CONF))
    assert "model.optimizer.lr" in str(err.value) and "trainer.max_steps" in str(err.value)


def test_a_sweep_is_checked_on_its_first_job_and_flags_anywhere_are_fine():
    precheck(["train.py", "-m", "model.optimizer.lr=1e-4,3e-4"], str(CONF))
    # an Optuna search range on the command line (hparams_search=optuna)
    search = "model.optimizer.lr=tag(log, interval(1e-5, 1e-4))"
    cfg = precheck(["train.py", "-m", "hparams_search=optuna", search], str(CONF))
    assert cfg.model.optimizer.lr == 1e-5
    precheck(["train.py", "model=trm_sudoku", "data=sudoku", "--cfg", "job"], str(CONF))


def test_an_auto_batch_is_not_a_type_error_where_the_preflight_picks_it():
    cfg = precheck(["train.py", "hardware=m2_air"], str(CONF))
    assert cfg.hardware.batch_size == "auto"


def test_values_the_run_passes_itself_replace_the_config_placeholder():
    cfg = precheck(["train.py", "hardware=m2_air"], str(CONF))
    with pytest.raises(ConfigError, match="data.batch_size='from_profile'"):
        check_config(cfg)
    check_config(cfg, {"data.batch_size": 1})


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["model.optimizer.lr=abc"], "model.optimizer.lr"),
        (["hardware=m9"], "hardware=m9"),
        (["data.files.nope=1"], "+data.files.nope=1"),
        (["run_name=../escaped"], "run_name='../escaped'"),
        (["hardware=cpu", "hardware.memory_fraction=nan"], "hardware.memory_fraction=nan"),
        (["hardware=cpu", "hardware.memory_budget_gb=inf"], "hardware.memory_budget_gb=inf"),
        (["hardware=cpu", "hardware.torch_threads=-1"], "hardware.torch_threads=-1"),
    ],
)
def test_train_py_refuses_bad_input_in_one_line_before_any_work_and_writes_no_run_folder(
    tmp_path, args, names
):
    result = train_here(args, tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "cache").exists()
    assert not (tmp_path / "escaped").exists()  # run_name=../escaped: nothing beside outputs/
