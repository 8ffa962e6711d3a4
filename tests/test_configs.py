"""Every option of every group composes and resolves; a new YAML is tested without editing this file.
A user's own presets (``_target_: user.…``, e.g. from ``laptrain new``) are theirs: a model preset
that reads its own data preset's keys composes with that data only, so they are left out here."""

from __future__ import annotations

import copy
import functools

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

from tests.conftest import CONF, compose_train
from tests.new_project import laptrain_options


def options(group: str) -> list[str]:
    return laptrain_options(CONF, group)


@functools.cache
def _composed(choice: str) -> DictConfig:
    """One composition per model / data option (Hydra's compose costs ~0.2 s on 2 cores)."""
    return compose_train([choice])


@pytest.mark.parametrize("hardware", options("hardware"))
def test_every_hardware_profile_composes_with_every_model_and_every_data(hardware, tmp_path):
    """Each model (with the default data) and each data option (with the default model) under
    every profile: the interpolations between the groups resolve. (Every option of every group is
    also bound to its constructors in test_config_check.py.)

    A profile writes the ``hardware`` node only (checked first: its composition equals the
    default one everywhere else), so the pair's composition is the option's own with this
    profile's ``hardware`` node in it: 1 + 15 compositions per profile instead of 15 x 18."""
    profile = compose_train([f"hardware={hardware}"])
    default = _composed("hardware=auto")
    elsewhere = [OmegaConf.to_container(c) for c in (profile, default)]
    for container in elsewhere:
        del container["hardware"], container["hydra"]
    assert elsewhere[0] == elsewhere[1]
    choices = [f"model={m}" for m in options("model")] + [f"data={d}" for d in options("data")]
    for chosen in choices:
        cfg = copy.deepcopy(_composed(chosen))
        with open_dict(cfg):
            cfg.hardware = copy.deepcopy(profile.hardware)
            cfg.paths.output_dir = str(tmp_path / "run")  # as compose_train(..., tmp_path) sets
            cfg.paths.cache_dir = str(tmp_path / "cache")
        container = OmegaConf.to_container(cfg.hardware, resolve=True)
        assert (
            container["batch_size"] is None
            or container["batch_size"] == "auto"
            or container["batch_size"] >= 1
        ), chosen
        for key in ("trainer", "data", "model", "callbacks", "logger", "paths"):
            OmegaConf.to_container(cfg[key], resolve=True)


@pytest.mark.parametrize("hardware", options("hardware"))
def test_profiles_are_data_with_the_keys_other_groups_read(hardware, tmp_path):
    hw = compose_train([f"hardware={hardware}"], tmp_path).hardware
    for key in (
        "name",
        "accelerator",
        "devices",
        "precision",
        "batch_size",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
        "torch_threads",
        "env",
    ):
        assert key in hw, f"conf/hardware/{hardware}.yaml lacks {key}"
    assert "_target_" not in hw
    # docs/hardware.md §5: these two are errors with workers == 0, and pinning only helps CUDA.
    if hw.num_workers == 0:
        assert not hw.persistent_workers and hw.prefetch_factor is None
    if hw.accelerator != "cuda":
        assert not hw.pin_memory
    # docs/hardware.md §1: never field note 000's 0.0, and LOW <= HIGH or the first MPS allocation fails.
    env = hw.env or {}
    if "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in env:
        high = float(env["PYTORCH_MPS_HIGH_WATERMARK_RATIO"])
        assert high > 0.0
        assert float(env.get("PYTORCH_MPS_LOW_WATERMARK_RATIO", 0)) <= high


def test_m2_air_profile_carries_seed_000_settings(tmp_path):
    cfg = compose_train(["hardware=m2_air"], tmp_path)
    hw = cfg.hardware
    # field note 000's batch 12 was SciBERT at 256 tokens on 16 GB; the preflight does that sum per job.
    assert (hw.batch_size, hw.num_workers, hw.pin_memory, hw.accelerator) == (
        "auto",
        0,
        False,
        "mps",
    )
    assert hw.env.PYTORCH_ENABLE_MPS_FALLBACK == "1"
    assert hw.env.OMP_NUM_THREADS == "4"
    # the data and trainer groups follow the profile
    assert hw.torch_threads == 4 and "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in hw.env
    assert cfg.data.num_workers == 0 and cfg.trainer.accelerator == "mps"
    assert cfg.trainer.precision == hw.precision


def test_seed_001_numbers_per_device(tmp_path):
    want = {"m5": ("auto", 4), "cuda": (32, 2), "cpu": (16, 0)}
    for name, (batch, workers) in want.items():
        hw = compose_train([f"hardware={name}"], tmp_path).hardware
        assert (hw.batch_size, hw.num_workers) == (batch, workers), name
    assert compose_train(["hardware=cuda"], tmp_path).hardware.precision == "16-mixed"


def test_run_folder_is_named_by_the_run_not_the_clock(tmp_path):
    cfg = compose_train(["model=tiny_classifier", "data=stdlib_docstrings"], tmp_path)
    assert cfg.run_name == "tiny_classifier-stdlib_docstrings"
    assert (
        OmegaConf.to_container(cfg.hydra.run, resolve=True)["dir"]
        == "outputs/tiny_classifier-stdlib_docstrings"
    )
