"""Which objects a run's checkpoints may hold besides tensors and plain values: exactly those its
config builds (laptrain.checkpoints.trusted; issue 48, item 1)."""

from __future__ import annotations

import functools

import lightning.pytorch as pl
import pytest
import torch
from hydra.utils import instantiate
from torch import nn

from laptrain.checkpoints.checkpoint_io import read_checkpoint
from laptrain.checkpoints.trusted import RefusedGlobal, trusted_globals

MODEL = {
    "_target_": "tests.test_trusted_globals.Module",
    "net": {"_target_": "torch.nn.Linear", "in_features": 2, "out_features": 1},
    "optimizer": {"_target_": "torch.optim.Adam", "_partial_": True, "lr": 0.001},
}


class Module(pl.LightningModule):
    def __init__(self, net: nn.Module, optimizer, loss: nn.Module = nn.MSELoss()):  # noqa: B008
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = net


def saved(tmp_path, module: Module):
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, path)
    return path


def test_what_the_config_builds_loads_and_nothing_else(tmp_path):
    module = instantiate(MODEL, _convert_="all")
    trusted = trusted_globals([MODEL], module)
    names = {f"{g.__module__}.{g.__qualname__}" for g in trusted.allowed}
    assert {"torch.nn.modules.linear.Linear", "torch.optim.adam.Adam"} <= names
    assert type(module.hparams.optimizer) in trusted.allowed  # Hydra's functools.partial
    assert issubclass(type(module.hparams.optimizer), functools.partial)
    assert nn.MSELoss not in trusted.allowed  # a default argument: not built by the config
    path = tmp_path / "ok.ckpt"
    hparams = {k: v for k, v in module.hparams.items() if k != "loss"}
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": hparams}, path)
    assert read_checkpoint(path, trusted)["hyper_parameters"]["net"].in_features == 2
    with pytest.raises(RefusedGlobal, match="holds a torch.nn.modules.linear.Linear"):
        read_checkpoint(path)  # nothing allowed: still one line


def test_an_object_the_config_does_not_build_is_named_with_its_argument(tmp_path):
    module = instantiate(MODEL, _convert_="all")
    trusted = trusted_globals([MODEL], module)
    with pytest.raises(RefusedGlobal) as refused:
        read_checkpoint(saved(tmp_path, module), trusted)
    assert str(refused.value) == (
        f"{tmp_path / 'last.ckpt'} holds a torch.nn.modules.loss.MSELoss, which this run's config "
        "does not build, so it is not loaded (checkpoints are read with weights_only=True): build "
        "it from the config (a _target_ entry), or keep it out of the checkpoints with "
        'self.save_hyperparameters(ignore=["loss"]) in your module\'s __init__'
    )
