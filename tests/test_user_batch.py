"""A user's own datamodule gets the run's batch and loader settings the way Lightning finds them
(attribute or hparams, on the module or the datamodule), and the console says where (issue 35,
item 3)."""

from __future__ import annotations

import importlib
import json
import math
import re
import types

import pytest
from omegaconf import OmegaConf, open_dict

from laptrain.config.check import ConfigError
from laptrain.job.datamodule_settings import find_setting, set_setting
from laptrain.job.plan import build_run_plan, planned_datamodule
from tests.conftest import compose_train
from tests.test_plan import fake_preflight, launched
from tests.test_user_errors import train_user
from tests.user_style import BLOBS_YAML, FAST, FIXED_YAML, user_args, write_user_project


@pytest.fixture
def mytask(tmp_path, monkeypatch):
    """The user's ``mytask`` module, imported from a project folder outside src/laptrain."""
    write_user_project(tmp_path / "project")
    monkeypatch.syspath_prepend(str(tmp_path / "project"))
    monkeypatch.delitem(importlib.sys.modules, "mytask", raising=False)
    return importlib.import_module("mytask")


def user_cfg(tmp_path, data_yaml: str, *overrides: str):
    """The composed config with the user's data preset as ``data``."""
    cfg = compose_train(["hardware=cpu", *overrides], tmp_path)
    with open_dict(cfg):
        cfg.data = OmegaConf.create(data_yaml)
        for override in overrides:
            key, value = override.split("=", 1)
            if key.startswith("data."):
                OmegaConf.update(cfg, key, value)
    return cfg


def test_lightnings_lookup_finds_and_sets_the_batch_where_it_lives(mytask):
    model, data = mytask.MLPModule(), mytask.BlobsDataModule(batch_size=32)
    found = find_setting(model, data, "batch_size")
    assert (found.value, found.where) == (32, "BlobsDataModule.hparams.batch_size")
    assert set_setting(model, data, "batch_size", 12) == "BlobsDataModule.hparams.batch_size"
    assert data.hparams.batch_size == 12
    assert model._trainer is None  # the stand-in trainer is gone after the lookup
    attribute = types.SimpleNamespace(batch_size=5)  # a datamodule with a plain attribute
    assert find_setting(None, attribute, "batch_size").where == "SimpleNamespace.batch_size"
    module_only = mytask.MLPModule()
    module_only.hparams["batch_size"] = 7  # on the module's hparams, not the datamodule's
    found = find_setting(module_only, mytask.FixedBatchDataModule(), "batch_size")
    assert (found.value, found.where) == (7, "MLPModule.hparams.batch_size")


def test_an_auto_batch_from_the_preflight_reaches_a_user_datamodules_loader(tmp_path, mytask):
    cfg = user_cfg(tmp_path, BLOBS_YAML, "hardware.batch_size=auto", "data.batch_size=from_profile")
    model, data = mytask.MLPModule(), mytask.BlobsDataModule(batch_size=32)
    plan = build_run_plan(cfg, model, data, launched(cfg), preflight=fake_preflight(24, 1))
    line = next(x for x in plan.summary_lines() if x.startswith("micro batch size"))
    assert line == (
        "micro batch size: 24 (batch_size auto: the largest that fits the memory budget, "
        "set on BlobsDataModule.hparams.batch_size)"
    )
    trained = planned_datamodule(plan, model, data)
    trained.setup("fit")
    assert trained is data and trained.train_dataloader().batch_size == 24


def test_a_fixed_profile_batch_is_named_with_where_it_was_set(tmp_path, mytask):
    cfg = user_cfg(
        tmp_path,
        BLOBS_YAML,
        "hardware.batch_size=8",
        "data.batch_size=from_profile",
        "preflight.enabled=false",
    )
    model, data = mytask.MLPModule(), mytask.BlobsDataModule()
    plan = build_run_plan(cfg, model, data, launched(cfg))
    assert (
        "micro batch size: 8 (hardware.batch_size, set on BlobsDataModule.hparams.batch_size)"
        in (plan.summary_lines())
    )
    planned_datamodule(plan, model, data).setup("fit")
    assert data.train_dataloader().batch_size == 8


def test_the_profiles_loader_settings_reach_a_user_datamodule_or_one_line_says_it_sets_its_own(
    tmp_path, mytask
):
    cfg = user_cfg(
        tmp_path,
        BLOBS_YAML,
        "hardware.num_workers=2",
        "hardware.pin_memory=true",
        "preflight.enabled=false",
    )
    model, data = mytask.MLPModule(), mytask.BlobsDataModule()
    plan = build_run_plan(cfg, model, data, launched(cfg))
    planned_datamodule(plan, model, data)
    assert (data.hparams.num_workers, data.hparams.pin_memory) == (2, True)
    lines = plan.summary_lines()
    assert (
        "dataloader workers: 2 (hardware.num_workers, set on BlobsDataModule.hparams.num_workers)"
        in lines
    )
    own = [x for x in lines if "sets its own" in x]
    assert own == [
        "persistent_workers: BlobsDataModule sets its own (the profile's would reach its loaders "
        "as a persistent_workers attribute or hparams entry)"
    ]
    # a value the data config sets itself is kept
    explicit = user_cfg(
        tmp_path,
        BLOBS_YAML + "num_workers: 0\n",
        "hardware.num_workers=2",
        "preflight.enabled=false",
    )
    data = mytask.BlobsDataModule(num_workers=0)
    plan = build_run_plan(explicit, model, data, launched(explicit))
    planned_datamodule(plan, model, data)
    assert data.hparams.num_workers == 0 and "num_workers" not in plan.set_on


def test_a_datamodule_with_no_batch_size_asked_to_follow_the_profile_is_told_what_to_add(
    tmp_path, mytask
):
    cfg = user_cfg(tmp_path, FIXED_YAML, "data.batch_size=from_profile", "preflight.enabled=false")
    with pytest.raises(
        ConfigError,
        match=r"FixedBatchDataModule has no batch size to set.*"
        r"save_hyperparameters\(\).*batch_size=self.hparams.batch_size",
    ):
        build_run_plan(cfg, mytask.MLPModule(), mytask.FixedBatchDataModule(), launched(cfg))


@pytest.mark.slow  # ~8 s; the auto run below goes through train.py, this path is tested in process
def test_train_py_gives_the_profiles_batch_to_a_user_datamodule(tmp_path, monkeypatch):
    """Before: AttributeError 'BlobsDataModule' object has no attribute 'batch_size' (plan.py)."""
    project = write_user_project(tmp_path / "project")
    done = train_user(
        [
            "model=mlp",
            "data=blobs",
            *FAST,
            "hardware.batch_size=8",
            "data.batch_size=from_profile",
            *user_args(project),
        ],
        tmp_path,
        project,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert (
        "micro batch size: 8 (hardware.batch_size, set on BlobsDataModule.hparams.batch_size)"
        in out
    )
    assert "done at global step 30" in out  # 240 training rows / 8: the loader got the batch
    assert "test: acc" in out
    # one line names the guards built; the OOM backoff cuts its map-style loader, and says nothing
    assert "guards: graceful stop, nonfinite, OOM backoff\n" in out
    assert "oom_backoff" not in out + done.stderr and "UserWarning" not in done.stderr


def test_train_py_gives_an_auto_batch_to_a_user_datamodule(tmp_path, monkeypatch):
    """``hardware.batch_size=auto``: the preflight's batch is the one the user's loader yields."""
    project = write_user_project(tmp_path / "project")
    done = train_user(
        [
            "model=mlp",
            "data=blobs",
            *FAST,
            "hardware.batch_size=auto",
            "data.batch_size=from_profile",
            *user_args(project),
        ],
        tmp_path,
        project,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(
        r"micro batch size: (\d+) \(batch_size auto: the largest that fits the memory budget, "
        r"set on BlobsDataModule.hparams.batch_size\)",
        done.stdout,
    )
    assert found, done.stdout[-3000:]
    steps = math.ceil(240 / int(found.group(1)))  # 240 training rows, one epoch
    assert f"done at global step {steps}" in done.stdout


def test_train_py_backs_off_a_user_module_s_oom_and_trains_to_its_last_step(tmp_path, monkeypatch):
    """issue 48, item 3: an injected out-of-memory error in MLPModule's forward at step 3, for
    batches over 4 rows. Before, it ended the run; now the loader's batch is cut to 4 and
    accumulated twice, and the epoch ends at the step it would have."""
    project = write_user_project(tmp_path / "project")
    oom = ["+callbacks.oom._target_=tests.oom_at.OutOfMemoryAbove", "+callbacks.oom.step=3"]
    done = train_user(
        [
            "model=mlp",
            "data=blobs",
            *FAST,
            "hardware.batch_size=8",
            "data.batch_size=from_profile",
            *oom,
            "+callbacks.oom.fits=4",
            *user_args(project),
        ],
        tmp_path,
        project,
        monkeypatch,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "done at global step 30" in done.stdout  # 240 rows / 8, as without the error
    said = done.stdout + done.stderr
    assert "oom_backoff: out of memory in step 3 with micro-batch 8; retrying with 4" in said
    report = json.loads((tmp_path / "outputs" / "mlp-blobs" / "report.json").read_text())
    assert [(e["step"], e["from"], e["to"]) for e in report["oom"]["events"]] == [(3, 8, 4)]
