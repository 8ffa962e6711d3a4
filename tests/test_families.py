"""The family contract: every model preset of laptrain's own belongs to a family found from its
``_target_``, the launch, the preflight CLI, the doctor and the device smoke ask the family instead
of comparing ``_target_`` strings, and a user's presets beside them (``laptrain new``) belong to
none and break nothing."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf
from smoke_harness.builds import SMOKE_BUILDS

from laptrain.commands import cli
from laptrain.family import (
    Family,
    family_of,
    family_of_module,
    family_of_preset,
    family_of_target,
    installed_families,
)
from laptrain.hardware.profile import ProfileError
from laptrain.launch.device import check_device
from tests.conftest import CONF, ROOT, compose_train
from tests.fakes import FakeProbe
from tests.new_project import laptrain_options, new_project

PRESETS = laptrain_options(CONF, "model")
FAMILIES = {f.name: f for f in installed_families()}


def test_laptrain_s_three_wings_are_installed_families():
    assert sorted(FAMILIES) == ["classifier", "lora", "trm"]
    assert all(isinstance(f, Family) for f in FAMILIES.values())


@pytest.mark.parametrize("preset", PRESETS)
def test_every_model_preset_belongs_to_the_family_of_its_wing(preset):
    family = family_of_preset(preset, CONF)
    assert family is not None, f"conf/model/{preset}.yaml: its _target_ is in no family's package"
    target = OmegaConf.load(CONF / "model" / f"{preset}.yaml")._target_
    assert target.startswith(f"laptrain.families.{family.name}.")
    assert family_of({"_target_": target}) is family is family_of_target(target)
    assert family.refusal("cpu", "32-true") is None  # every family trains in float32 on CPU


def test_finding_a_family_imports_neither_torch_nor_the_module():
    """The launch asks before torch is imported: only the wing's package is imported."""
    code = (
        "import sys\n"
        "from laptrain.family import family_of_target\n"
        "for t in ('laptrain.families.lora.causal_lm.CausalLMLoRAModule',\n"
        "          'laptrain.families.trm.TRMSudokuModule', 'torch.nn.Linear',\n"
        "          'laptrain.families.lora.instructions.InstructionDataModule'):\n"
        "    family_of_target(t)\n"
        "print(sorted(m for m in ('torch', 'lightning', 'transformers',\n"
        "      'laptrain.families.lora.causal_lm') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_family_with_a_smoke_hook_has_its_smoke_build():
    assert set(SMOKE_BUILDS) == {n for n, f in FAMILIES.items() if f.smoke is not None}
    for name, family in FAMILIES.items():
        smoke = family.smoke()
        assert smoke.__name__ == f"laptrain.families.{name}.smoke"
        assert SMOKE_BUILDS[name].build is smoke.build
        assert SMOKE_BUILDS[name].predict is smoke.predict


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_hook_is_callable_and_the_commands_reach_the_cli(name):
    family = FAMILIES[name]
    for field in ("refuse_precision", "doctor_check", "auto_settings", "sizing", "file_rules"):
        hook = getattr(family, field)
        assert hook is None or callable(hook), field
    if family.commands is not None:
        commands = family.commands()
        assert commands.COMMANDS
        table = cli.command_table(cli.family_commands())
        assert all(table[c] is f for c, f in commands.COMMANDS.items())


def test_a_user_module_is_no_family_and_runs_without_family_rules():
    assert family_of({"_target_": "my_project.MyModule"}) is None
    assert family_of_preset("no_such_preset", CONF) is None


def test_user_presets_beside_laptrain_s_own_are_none_of_laptrain_s_families(tmp_path):
    """conf/model/ with `laptrain new`'s preset in it: the check above still covers every
    laptrain preset and passes; the user's is none of laptrain's families (its package declares
    its own, found without importing it here: the file is read, not run)."""
    conf = new_project(tmp_path / "clone") / "conf"
    user_target = OmegaConf.load(conf / "model" / "my_task.yaml")._target_
    assert user_target == "user.my_task.model.MyTaskModule"
    assert laptrain_options(conf, "model") == PRESETS
    assert all(family_of_preset(p, conf) is not None for p in laptrain_options(conf, "model"))
    assert family_of_preset("my_task", conf) is None  # user/ is not on this process's path

    import lightning.pytorch as pl

    class MyTaskModule(pl.LightningModule):  # a user's class named like no family's
        pass

    assert family_of_module(MyTaskModule()) is None


def test_a_user_package_declares_a_family_the_same_way(tmp_path, monkeypatch):
    """``FAMILY`` in ``user/<task>/__init__.py``: found from the module's _target_, and its hooks
    are asked like laptrain's own (here its precision rule, at the launch)."""
    task = tmp_path / "user" / "fam_task"
    task.mkdir(parents=True)
    (task / "__init__.py").write_text(
        "from laptrain.family import Family\n\n\n"
        "def _no_half(kind, precision):\n"
        "    return 'my model keeps float32: set hardware.precision=32-true' "
        "if '16' in precision else None\n\n\n"
        "FAMILY = Family(name='fam_task', summary='a user family', refuse_precision=_no_half)\n"
    )
    (task / "model.py").write_text("raise ImportError('the module itself is never imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        family = family_of_target("user.fam_task.model.MyModule")
        assert family is not None and family.name == "fam_task"
        assert family.refusal("cpu", "bf16-mixed").startswith("my model keeps float32")
        assert "user.fam_task.model" not in sys.modules
    finally:  # later tests import their own user/ package
        for name in [m for m in sys.modules if m == "user" or m.startswith("user.")]:
            del sys.modules[name]


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
