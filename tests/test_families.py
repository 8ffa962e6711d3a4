"""The family registry: every model preset of laptrain's own belongs to a family, and the launch,
the preflight CLI, the doctor and the device smoke all ask it instead of comparing ``_target_``
strings. A user's presets beside them (``laptrain new``) belong to none and break nothing."""

from __future__ import annotations

import importlib

import lightning.pytorch as pl
import pytest
from omegaconf import OmegaConf

from laptrain.commands import cli
from laptrain.device_smoke.builds import SMOKE_BUILDS
from laptrain.hardware.probe import FakeProbe
from laptrain.hardware.profile import ProfileError
from laptrain.launch.device import check_device
from laptrain.model.families import (
    FAMILIES,
    family_of,
    family_of_module,
    family_of_preset,
    family_of_target,
)
from tests.conftest import CONF, compose_train
from tests.new_project import laptrain_options, new_project

PRESETS = laptrain_options(CONF, "model")


@pytest.mark.parametrize("preset", PRESETS)
def test_every_model_preset_resolves_to_a_registry_entry(preset):
    family = family_of_preset(preset, CONF)
    assert family is not None, f"conf/model/{preset}.yaml: its _target_ is in no registry entry"
    target = OmegaConf.load(CONF / "model" / f"{preset}.yaml")._target_
    assert family_of({"_target_": target}) is family is family_of_target(target)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_entry_names_a_lightning_module_in_its_own_package(name):
    family = FAMILIES[name]
    module, _, cls = family.module.rpartition(".")
    assert module.startswith(f"laptrain.model.{name}")  # laptrain/model/<family>/
    assert issubclass(getattr(importlib.import_module(module), cls), pl.LightningModule)
    assert family.refusal("cpu", "32-true") is None  # every family trains in float32 on CPU


def test_every_family_has_its_smoke_build_in_its_own_package():
    assert set(SMOKE_BUILDS) == set(FAMILIES)
    for name, family in FAMILIES.items():
        assert family.smoke == f"laptrain.model.{name}.smoke"
        smoke = importlib.import_module(family.smoke)
        assert (
            SMOKE_BUILDS[name].build is smoke.build and SMOKE_BUILDS[name].predict is smoke.predict
        )


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_hook_an_entry_names_imports_and_its_commands_reach_the_cli(name):
    """Entries name their hooks by string: each one imports and is a function, and the module of
    the family's own commands is in the CLI's parser and command map, after one of its own."""
    family = FAMILIES[name]
    for field in ("refuse_precision", "doctor_check", "auto_settings", "sizing"):
        if getattr(family, field) is not None:
            assert callable(family.hook(field)), field
    if family.tools:
        tools = importlib.import_module(family.tools)
        assert tools.LISTED_AFTER in cli.PARSERS
        assert tools.COMMANDS and all(cli.COMMANDS[c] is f for c, f in tools.COMMANDS.items())


def test_a_user_module_is_no_family_and_runs_without_family_rules():
    assert family_of({"_target_": "my_project.MyModule"}) is None
    assert family_of_preset("no_such_preset", CONF) is None


def test_user_presets_beside_laptrain_s_own_are_no_family_and_the_own_ones_all_are(tmp_path):
    """conf/model/ with `laptrain new`'s preset in it: the check above still covers every
    laptrain preset and passes; the user's is no family, by preset, target or built module."""
    conf = new_project(tmp_path / "clone") / "conf"
    user_target = OmegaConf.load(conf / "model" / "my_task.yaml")._target_
    assert user_target == "user.my_task.model.MyTaskModule"
    assert laptrain_options(conf, "model") == PRESETS
    assert all(family_of_preset(p, conf) is not None for p in laptrain_options(conf, "model"))
    assert family_of_preset("my_task", conf) is None
    assert family_of({"_target_": user_target}) is None

    class MyTaskModule(pl.LightningModule):  # a user's class named like no family's
        pass

    assert family_of_module(MyTaskModule()) is None


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (["experiment=trm_sudoku", "hardware.precision=bf16-mixed"], "TRM runs float32 on cpu"),
        (
            ["model=tiny_llama_lora", "hardware.precision=bf16-true"],
            "keeps its adapters in float32",
        ),
    ],
)
def test_the_launch_refuses_a_precision_the_family_cannot_train_at(overrides, refused):
    """One place decides: the device check asks the family's rule before any data or model."""
    cfg = compose_train(["hardware=cpu", *overrides])
    with pytest.raises(ProfileError, match=refused) as err:
        check_device(cfg, FakeProbe(kind="cpu"))
    assert "\n" not in str(err.value)


def test_the_same_rules_answer_the_device_smoke():
    assert SMOKE_BUILDS["trm"].refusal("cpu", "bf16-mixed") == FAMILIES["trm"].refusal(
        "cpu", "bf16-mixed"
    )
    assert SMOKE_BUILDS["classifier"].refusal("cuda", "16-true") is None
