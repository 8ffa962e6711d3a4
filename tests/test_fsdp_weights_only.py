"""Under ``trainer=fsdp`` a full checkpoint is loaded with ``weights_only=True`` too, with the
objects the run's config builds allowed (issue 48, item 7): Lightning's own ``_lazy_load``
unpickles anything (lightning/fabric/utilities/load.py:179-213)."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import FSDPStrategy

from laptrain.checkpoints.checkpoint_io import AtomicCheckpointIO, weights_only_under_fsdp
from laptrain.checkpoints.trusted import RefusedGlobal, TrustedGlobals


class Foreign:
    """An object no config built."""


def fsdp_strategy(trusted: TrustedGlobals) -> FSDPStrategy:
    """Lightning's FSDP strategy with laptrain's checkpoint IO, holding a module (not wrapped:
    a full checkpoint's weights load into it the same way)."""
    strategy = FSDPStrategy()
    strategy.checkpoint_io = AtomicCheckpointIO(trusted)
    strategy.model = strategy._lightning_module = BoringModel()
    weights_only_under_fsdp(strategy)
    return strategy


def full_checkpoint(tmp_path, extra: object):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": BoringModel().state_dict(), "hyper_parameters": {"x": extra}}, path)
    return path


def test_a_foreign_global_is_refused_under_fsdp(tmp_path):
    strategy = fsdp_strategy(TrustedGlobals())
    with pytest.raises(RefusedGlobal, match=r"holds a tests\.test_fsdp_weights_only\.Foreign"):
        strategy.load_checkpoint(full_checkpoint(tmp_path, Foreign()))


def test_what_the_config_builds_loads_under_fsdp(tmp_path):
    strategy = fsdp_strategy(TrustedGlobals((Foreign,)))
    loaded = strategy.load_checkpoint(full_checkpoint(tmp_path, Foreign()))
    assert isinstance(loaded["hyper_parameters"]["x"], Foreign)
