"""The FSDP units of a model: which modules ``trainer=fsdp`` wraps on their own, so that every
unit's flat parameter has one dtype, and what a rank holds gathered at the peak of a step.

FSDP1's flat parameter has one dtype (``_validate_tensors_to_flatten``,
torch/distributed/fsdp/_flat_param.py), so one unit fails a bf16 base with fp32 adapters. The
units (:func:`unit_rule`): the root, ``Family.fsdp_layers``, and every leaf whose dtype or
``requires_grad`` differs from its unit's (docs/sweeps.md, "Several processes").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from laptrain.family import family_of_module
from laptrain.model.contracts import KeepsTrainableOnly

UnitSpec = Callable[[nn.Module], bool] | Iterable[type[nn.Module]] | None
"""Which modules besides the root become units: a predicate, a set of classes (torch's
``ModuleWrapPolicy``), or None (the root alone: Lightning without a policy)."""


def transformers_layers(module: nn.Module) -> set[type[nn.Module]]:
    """The classes that the ``_no_split_modules`` of the transformers models in ``module`` name
    (e.g. ``LlamaDecoderLayer``; ``BertEmbeddings`` and ``BertLayer``), found in the tree."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(type(sub), "_no_split_modules", None) or ())
    return {type(sub) for sub in module.modules() if type(sub).__name__ in names}


def layer_classes(module: nn.Module) -> set[type[nn.Module]]:
    """The family's layer classes for the built ``module``; for a module of no family, the
    classes its transformers models name (none: the root and the odd leaves are the units)."""
    family = family_of_module(module)
    if family is not None and family.fsdp_layers is not None:
        return set(family.fsdp_layers(module))
    return transformers_layers(module)


def _post_order(root: nn.Module) -> list[tuple[str, nn.Module]]:
    """Named modules, children before parents (torch's ``_get_post_order_named_modules``)."""
    seen = {root}
    stack, order = [("", root)], []
    while stack:
        name, module = stack.pop()
        order.append((name, module))
        for child_name, child in module.named_children():
            if child is not None and child not in seen:
                seen.add(child)
                stack.append((f"{name}.{child_name}" if name else child_name, child))
    return order[::-1]


def _predicate(spec: UnitSpec) -> Callable[[nn.Module], bool]:
    if spec is None:
        return lambda _: False
    if callable(spec) and not isinstance(spec, type):
        return spec
    classes = tuple(spec)
    return lambda module: isinstance(module, classes)


def unit_params(module: nn.Module, spec: UnitSpec) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """``{unit name: the (name, parameter) pairs it flattens}``, the root named ``""``, as FSDP
    assigns them: units in post-order, each taking the parameters of its subtree that no inner
    unit took (``_get_managed_param_to_fqn``, ``torch/distributed/fsdp/_wrap_utils.py``; a shared
    parameter goes to the first, ``_get_orig_params`` in ``_init_utils.py``)."""
    is_unit = _predicate(spec)
    visited: set[nn.Module] = set()
    taken: set[int] = set()
    units: dict[str, list[tuple[str, nn.Parameter]]] = {}
    for name, unit in _post_order(module):
        if unit is not module and not is_unit(unit):
            continue
        managed: list[tuple[str, nn.Parameter]] = []
        queue = deque([(unit, name)])
        visited.add(unit)
        while queue:
            sub, prefix = queue.popleft()
            for param_name, param in sub.named_parameters(recurse=False):
                if id(param) not in taken:
                    taken.add(id(param))
                    managed.append((f"{prefix}.{param_name}" if prefix else param_name, param))
            for child_name, child in sub.named_children():
                if child is not None and child not in visited:
                    visited.add(child)
                    queue.append((child, f"{prefix}.{child_name}" if prefix else child_name))
        units[name] = managed
    return units


def _kind(param: nn.Parameter) -> tuple[str, bool]:
    return str(param.dtype), bool(param.requires_grad)


@dataclass(eq=False)
class UnitRule:
    """The unit predicate FSDP's ``CustomPolicy`` calls: a layer class, or one of the odd leaves."""

    layers: tuple[type[nn.Module], ...]
    leaves: dict[int, nn.Module] = field(default_factory=dict)  # id -> module (kept alive)

    def __call__(self, module: nn.Module) -> bool:
        return isinstance(module, self.layers) or id(module) in self.leaves


def unit_rule(module: nn.Module) -> UnitRule:
    """The units of ``module`` (see the module docstring): its layer classes, and each leaf whose
    parameters are not of the kind (dtype, requires_grad) that holds most of its unit's."""
    rule = UnitRule(tuple(sorted(layer_classes(module), key=lambda c: c.__qualname__)))
    owner: dict[int, tuple[str, bool]] = {}  # parameter id -> its unit's main kind
    for params in unit_params(module, rule).values():
        sizes: dict[tuple[str, bool], int] = {}
        for _, param in params:
            sizes[_kind(param)] = sizes.get(_kind(param), 0) + param.numel()
        main = max(sizes, key=lambda kind: sizes[kind]) if sizes else None
        owner.update({id(param): main for _, param in params if main is not None})
    for sub in module.modules():
        own = list(sub.parameters(recurse=False))
        if sub is module or not own or next(sub.children(), None) is not None or rule(sub):
            continue
        if {_kind(p) for p in own} != {owner[id(own[0])]}:
            rule.leaves[id(sub)] = sub
    return rule


def units_with_mixed_dtypes(module: nn.Module, spec: UnitSpec) -> list[str]:
    """The units FSDP1 could not flatten under ``spec``: ``"name (dtype, dtype)"``, or ``"name
    (dtype: not floating point)"`` (a 4-bit base stored as uint8); ``<root>`` is the module. Empty:
    all fit."""
    problems = []
    for name, params in unit_params(module, spec).items():
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for _, p in params})
        shown = name or "<root>"
        if len(dtypes) > 1:
            problems.append(f"{shown} ({', '.join(dtypes)})")
        elif params and not params[0][1].is_floating_point():
            problems.append(f"{shown} ({dtypes[0]}: not floating point)")
    return problems


def _units_policy(rule: UnitRule) -> Any:
    """torch's ``CustomPolicy`` over ``rule``, marked as laptrain's (so a later module replaces it)."""
    from torch.distributed.fsdp.wrap import CustomPolicy

    policy = CustomPolicy(rule)
    policy.laptrain_units = True  # type: ignore[attr-defined]
    return policy


def fsdp_strategy_for(model: nn.Module, strategy: Any) -> Any:
    """``strategy`` with ``model``'s units as its ``auto_wrap_policy`` when it is Lightning's
    ``FSDPStrategy`` (set in place: ``_setup_model`` reads ``strategy.kwargs`` when the fit starts;
    an earlier module's policy is replaced). Any other strategy, or one naming its own policy, comes
    back untouched. Raises ValueError (one line) for a family FSDP cannot train
    (``Family.fsdp_refusal``) or a unit that would still mix dtypes."""
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(strategy, FSDPStrategy):
        return strategy
    family = family_of_module(model)
    if family is not None and family.fsdp_refusal:
        raise ValueError(f"trainer=fsdp cannot train {family.name}: {family.fsdp_refusal}")
    if isinstance(model, KeepsTrainableOnly):
        keep_trainable_only(strategy)
    keep_buffers_in_fp32(strategy)
    policy = strategy.kwargs.get("auto_wrap_policy")
    if policy is not None and not getattr(policy, "laptrain_units", False):
        return strategy
    rule = unit_rule(model)
    mixed = units_with_mixed_dtypes(model, rule)
    if mixed:
        raise ValueError(
            f"trainer=fsdp cannot shard {type(model).__name__}: FSDP flattens each unit's "
            f"parameters into one tensor of one floating dtype, and {len(mixed)} unit(s) are not: "
            f"{'; '.join(mixed[:3])}{' ...' if len(mixed) > 3 else ''} "
            "(a 4-bit base needs a float quant storage dtype; or use trainer=ddp)"
        )
    strategy.kwargs["auto_wrap_policy"] = _units_policy(rule)
    return strategy


def keep_buffers_in_fp32(strategy: Any) -> None:
    """Under ``16-mixed`` / ``bf16-mixed``, FSDP keeps the module's floating buffers in float32.
    Lightning sets ``buffer_dtype`` to the 16-bit ``param_dtype`` (plugins/precision/fsdp.py) and
    FSDP casts the buffers at the first forward (``_cast_buffers_to_dtype_and_device``): a Llama's
    RoPE ``inv_freq`` was rounded to 16 bits under FSDP only. A user's ``mixed_precision`` and
    ``-true`` precisions are left alone."""
    from dataclasses import replace

    plugin = getattr(strategy, "precision_plugin", None)
    if strategy.mixed_precision is not None or not str(getattr(plugin, "precision", "")).endswith(
        "-mixed"
    ):
        return
    config = strategy.mixed_precision_config
    if config is not None:
        strategy.mixed_precision = replace(config, buffer_dtype=torch.float32)


def gathers_in_lower_precision(strategy: Any) -> bool:
    """Whether ``strategy`` is Lightning's FSDP with a 16-bit ``param_dtype`` (``FSDPPrecision.
    mixed_precision_config``): a parameter read outside its unit is then its float32 shard, inside
    the unit's forward the gathered 16-bit copy."""
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(strategy, FSDPStrategy):
        return False
    config = strategy.mixed_precision_config
    return config is not None and config.param_dtype not in (None, torch.float32)


def holds_fsdp_units(module: nn.Module) -> bool:
    """Whether FSDP units were applied inside ``module`` (a fit under ``trainer=fsdp`` wraps them
    in place; they stay after the fit, the root's own parameters left as views of its shards)."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    return any(isinstance(sub, FSDP) for sub in module.modules())


@dataclass(frozen=True)
class GatheredUnits:
    """What FULL_SHARD holds unsharded at a step's peak, in parameters (docs/sweeps.md): the root
    unit, the two largest other units (computing and prefetched), and the unsharded gradients of the
    root and one other unit before their reduce-scatter."""

    params: int
    grads: int


def gathered_units(module: nn.Module) -> GatheredUnits:
    """:class:`GatheredUnits` of ``module`` under :func:`unit_rule`."""
    units = unit_params(module, unit_rule(module))
    root = units.pop("", [])
    sizes = sorted((sum(p.numel() for _, p in params) for params in units.values()), reverse=True)
    trainable = [sum(p.numel() for _, p in params if p.requires_grad) for params in units.values()]
    root_trainable = sum(p.numel() for _, p in root if p.requires_grad)
    return GatheredUnits(
        params=sum(p.numel() for _, p in root) + sum(sizes[:2]),
        grads=root_trainable + max(trainable, default=0),
    )


# Inserted into parameter names by FSDP's wrapper, and by torch's activation-checkpoint wrapper
# (FSDP_PREFIX and _CHECKPOINT_PREFIX in torch/distributed/fsdp/_common_utils.py).
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.")


def unwrapped_name(name: str) -> str:
    """A parameter's name as ``state_dict`` keys it: with ``use_orig_params=True`` the names carry
    the wrappers' prefixes, which FSDP's full state dict drops (``clean_tensor_name``,
    torch/distributed/fsdp/_common_utils.py)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _offloads(strategy: Any, world_size: int) -> bool:
    """Whether a gather for rank 0 goes to host memory: only from an accelerator with several ranks
    (one rank runs NO_SHARD, where FSDP has no offload; from CPU parameters the post-state-dict
    hook's clone read freed memory: a segfault with 2 gloo ranks, torch 2.13)."""
    return world_size > 1 and strategy.root_device.type != "cpu"


def whole_state_dict(trainer: Any) -> dict[str, Any] | None:
    """Under ``trainer=fsdp`` the LightningModule's state dict gathered from the shards, complete on
    rank 0 (every rank must call it): ``FULL_STATE_DICT`` with ``rank0_only``, as Lightning's
    ``_get_full_state_dict_context`` does; for a ``KeepsTrainableOnly`` module only those
    (:func:`trainable_state_dict`). None under any other strategy."""
    from lightning.pytorch.strategies import FSDPStrategy

    if not isinstance(trainer.strategy, FSDPStrategy):
        return None
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    root = trainer.strategy.model  # the FSDP unit around the LightningModule
    if isinstance(root.module, KeepsTrainableOnly):
        return trainable_state_dict(root, _offloads(trainer.strategy, trainer.world_size))
    config = FullStateDictConfig(
        offload_to_cpu=_offloads(trainer.strategy, trainer.world_size), rank0_only=True
    )
    with FSDP.state_dict_type(root, StateDictType.FULL_STATE_DICT, config):
        return root.state_dict()


def _trainable_by_unit(root: nn.Module) -> dict[nn.Module, list[tuple[str, nn.Parameter]]]:
    """``{FSDP unit: its trainable (name, parameter) pairs}``, in module order (the same on every
    rank), names as ``state_dict`` keys them."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    found: dict[nn.Module, list[tuple[str, nn.Parameter]]] = {}
    seen: set[int] = set()

    def walk(module: nn.Module, prefix: str, unit: nn.Module) -> None:
        unit = module if isinstance(module, FSDP) else unit
        for name, param in module.named_parameters(recurse=False):
            if param.requires_grad and id(param) not in seen:
                seen.add(id(param))
                found.setdefault(unit, []).append((unwrapped_name(prefix + name), param))
        for name, child in module.named_children():
            walk(child, f"{prefix}{name}.", unit)

    walk(root, "", root)
    return found


def trainable_state_dict(root: nn.Module, offload: bool) -> dict[str, torch.Tensor]:
    """The trainable parameters of the FSDP-wrapped ``root``, whole, on rank 0 (empty on the others;
    every rank must call it). Only units holding a trainable parameter are gathered, each alone
    (``summon_full_params(recurse=False)``), so a LoRA run's frozen base stays sharded: FSDP's
    state-dict APIs gather everything and filter afterwards (``ignore_frozen_params``,
    torch/distributed/checkpoint/state_dict.py), Lightning's has no filter."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    out: dict[str, torch.Tensor] = {}
    for unit, params in _trainable_by_unit(root).items():
        with FSDP.summon_full_params(
            unit, recurse=False, writeback=False, rank0_only=True, offload_to_cpu=offload
        ):
            if rank0:
                out.update((name, param.detach().clone()) for name, param in params)
    return out


def keep_trainable_only(strategy: Any) -> None:
    """Make Lightning's FSDP (``state_dict_type: full``) gather only the trainable parameters for
    the checkpoints of a ``KeepsTrainableOnly`` module: this instance's
    ``lightning_module_state_dict`` becomes :func:`trainable_state_dict` (Lightning has no hook for
    it); the keys are those the module's ``on_save_checkpoint`` kept anyway."""
    if strategy._state_dict_type != "full":
        return

    def lightning_module_state_dict() -> dict[str, Any]:
        return trainable_state_dict(strategy.model, _offloads(strategy, strategy.world_size))

    strategy.lightning_module_state_dict = lightning_module_state_dict


def inner_state_dict(state_dict: dict[str, Any] | None, attribute: str) -> dict[str, Any] | None:
    """The entries of a LightningModule's state dict that belong to its submodule ``attribute``,
    keyed as that submodule's own ``state_dict`` (what ``save_pretrained(state_dict=...)`` takes)."""
    if state_dict is None:
        return None
    prefix = f"{attribute}."
    return {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
