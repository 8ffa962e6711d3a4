"""The model families laptrain trains, and what each one brings: the one registry that the launch
(precision rules), ``trainer=fsdp``, the device smoke test, ``laptrain doctor`` (a family's own
check), the job (a family's auto settings), ``laptrain preflight`` (memory from the config alone)
and the ``laptrain`` command line (a family's own commands) ask, instead of comparing ``_target_``
strings or family names.

A family is a package ``laptrain/model/<family>/`` with its LightningModule, one or more presets in
``conf/model/`` whose ``_target_`` is that module, and one :class:`ModelFamily` entry below that
carries its hooks (docs/model_families.md walks through adding one). Entries name code by dotted
path, so asking the registry imports neither torch nor the family: the launch asks it before torch
is imported. Two hooks stand on floors above this one and are the family's own files there: the
sizing (``laptrain/preflight/``) and the commands (``laptrain/commands/``); they are loaded only
when code on their own floor asks for them (``laptrain preflight``, the command line), never by
this module's own questions.

The registry holds laptrain's own modules only (``_target_: laptrain.…``). A module of the user's
own (``_target_: user.my_task.model.MyTaskModule``, docs/your_model.md) is no family and needs no
entry: every question here answers None for it, and the run applies no family rule to it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelFamily:
    """One model family.

    Attributes:
        name: the family's package under ``laptrain/model/`` (and its row in the device smoke).
        module: the LightningModule class its presets instantiate (their ``_target_``).
        summary: one line saying what the family trains (``laptrain preflight`` names the families
            it sizes with it).
        refuse_precision: ``"module:function"``, ``function(device_kind, precision)`` returning
            why the family does not train at that precision there, or None.
        sizing: ``"module:function"``, ``function(cfg, model_cfg)`` returning the lines
            ``laptrain preflight`` prints and whether the job fits, estimated from the composed
            config alone (no weights loaded); other families are measured by ``train.py``'s own
            preflight. Built on the preflight's estimator, it lives on the preflight's floor
            (``laptrain/preflight/``), above this one: only ``laptrain preflight`` loads it.
        smoke: the module with the family's smoke-test build: ``build(seed, steps)`` (with
            optional ``kind=``/``precision=`` keywords), ``predict(module, batch)`` and optionally
            ``note(kind)`` (``laptrain/model/<family>/smoke.py``), which the device smoke test
            fits, saves, resumes and predicts on every precision.
        fsdp_layers: ``"module:Name"``, the layer class whose every instance ``trainer=fsdp``
            wraps as its own FSDP unit, or a function of the built module returning those
            classes (``laptrain/model/fsdp_units.py``; None: the root alone).
        fsdp_refusal: why ``trainer=fsdp`` cannot train the family (one line, naming what to
            use instead), or None.
        variants: other LightningModules of the family, subclasses of ``module`` trained with
            another objective on the same model (the LoRA family's DPO), by dotted path.
        doctor_check: ``"module:function"``, ``function(profile)`` returning the
            ``laptrain.model.doctor_check.Check`` named ``<name> training`` that
            ``laptrain doctor model=<preset>`` runs after its own checks pass, or None.
        auto_settings: ``"module:function"``, ``function(model_cfg, budget_bytes, bf16_supported,
            say, capacity_bytes=)`` returning the constructor arguments that decide the model
            config's ``auto`` values on this device (the LoRA family's ``base_dtype: auto``:
            ``budget_bytes()`` and ``capacity_bytes()`` read the memory budget, ``say`` prints
            why), ``{}`` when it has none; the job calls it before building the module. None: the
            family has no such setting.
        tools: the module of the family's own ``laptrain`` commands (``laptrain predict`` for
            the classifier; ``export``, ``generate`` and ``eval`` for LoRA): its
            ``add_commands(commands)``, ``COMMANDS`` and ``LISTED_AFTER``, which
            ``laptrain/commands/cli.py`` adds to the CLI. They read runs with the commands'
            tools, a floor above this one, so the module lives in ``laptrain/commands/``.
    """

    name: str
    module: str
    summary: str
    smoke: str
    refuse_precision: str | None = None
    sizing: str | None = None
    fsdp_layers: str | None = None
    fsdp_refusal: str | None = None
    variants: tuple[str, ...] = ()
    doctor_check: str | None = None
    auto_settings: str | None = None
    tools: str | None = None

    def hook(self, field: str) -> Callable[..., Any] | None:
        """The function the entry's ``field`` names (``"module:function"``), imported now; None
        when the entry has none."""
        path = getattr(self, field)
        return None if path is None else _load(path)

    def refusal(self, device_kind: str, precision: str) -> str | None:
        """Why this family does not train at ``precision`` on ``device_kind`` (None: it does)."""
        if self.refuse_precision is None:
            return None
        return _load(self.refuse_precision)(device_kind, precision)

    def fsdp_layer_classes(self, module: Any) -> set[type]:
        """The classes of ``module`` (this family's built LightningModule) that FSDP wraps."""
        if self.fsdp_layers is None:
            return set()
        found = _load(self.fsdp_layers)
        return {found} if isinstance(found, type) else set(found(module))


FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        ModelFamily(
            "classifier",
            "laptrain.model.classifier.text_classifier.TextClassifierModule",
            "a transformers encoder with a classification head (tiny BERT, MiniLM, SciBERT)",
            "laptrain.model.classifier.smoke",
            fsdp_layers="laptrain.model.fsdp_units:transformers_layers",
            tools="laptrain.commands.predict",
        ),
        ModelFamily(
            "lora",
            "laptrain.model.lora.causal_lm.CausalLMLoRAModule",
            "a pretrained causal LM fine-tuned with peft LoRA adapters on instruction pairs",
            "laptrain.model.lora.smoke",
            refuse_precision="laptrain.model.lora.causal_lm:refuse_precision",
            sizing="laptrain.preflight.lora_sizing:report",
            fsdp_layers="laptrain.model.fsdp_units:transformers_layers",
            variants=("laptrain.model.lora.dpo.DPOLoRAModule",),
            doctor_check="laptrain.model.lora.doctor:check_training",
            auto_settings="laptrain.model.lora.base_dtype:resolve_auto_base_dtype",
            tools="laptrain.commands.lora_cli",
        ),
        ModelFamily(
            "trm",
            "laptrain.model.trm.TRMSudokuModule",
            "the Tiny Recursive Model on Sudoku (deep supervision, ACT halting, EMA)",
            "laptrain.model.trm.smoke",
            refuse_precision="laptrain.model.trm.module:refuse_precision",
            # measured on 2 gloo CPU ranks: "Expects BACKWARD_PRE or BACKWARD_POST state but got
            # HandleTrainingState.FORWARD" at step 1 (FSDP's post-backward hook)
            fsdp_refusal=(
                "its step back-propagates inside the forward (manual optimization, deep "
                "supervision), which FSDP's root unit does not allow, and its EMA keeps whole "
                "weights; its largest preset has 5 M parameters: use trainer=ddp"
            ),
        ),
    )
}


def _load(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def is_laptrain_target(target: object) -> bool:
    """Whether a ``_target_`` names laptrain's own code, the registry's scope (else: the user's)."""
    return str(target).startswith("laptrain.")


def family_of_target(target: object) -> ModelFamily | None:
    """The family whose LightningModule is ``target`` (a ``_target_`` string), or None."""
    if not is_laptrain_target(target):
        return None
    return next((f for f in FAMILIES.values() if str(target) in (f.module, *f.variants)), None)


def family_of_module(module: object) -> ModelFamily | None:
    """The family whose LightningModule ``module`` is an instance of (a subclass counts), or None."""
    names = {cls.__name__ for cls in type(module).__mro__}
    for family in FAMILIES.values():
        path, _, name = family.module.rpartition(".")
        if name in names and isinstance(module, getattr(importlib.import_module(path), name)):
            return family
    return None


def family_of(model: Mapping[str, Any] | None) -> ModelFamily | None:
    """The family of a ``model`` config (its ``_target_``), or None for a module of the user's own."""
    if not isinstance(model, Mapping):
        return None
    return family_of_target(model.get("_target_"))


def family_of_preset(name: str | None, conf: Path) -> ModelFamily | None:
    """The family of ``conf/model/<name>.yaml``, or None (no such preset, or not a family)."""
    if not name:
        return None
    path = conf / "model" / f"{name}.yaml"
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    return family_of_target(OmegaConf.load(path).get("_target_"))
