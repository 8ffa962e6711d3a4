"""What the families' smoke builds (``laptrain/families/<family>/smoke.py``) share: the preset read
from ``conf/model/<preset>.yaml`` and built as ``train.py`` builds it (sizes shrunk), and random
token rows in fixed batches: ``steps`` training batches and one validation batch. Two smoke rules
make the smoke run the branch a real run takes in one case: ``gradient_checkpointing: auto`` is
built as ``true`` (what the presets' big bases get), and ``optimizer.fused`` stays on where torch
has fused AdamW kernels (:data:`FUSED_DEVICES`) unless the launch turns it off
(``fused_optimizer_unsafe``, which both call)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from laptrain.config.check import LAPTRAIN_KEYS
from laptrain.hardware.profile import fused_optimizer_unsafe
from laptrain.project import conf_dir

# torch 2.13's fused Adam/AdamW kernels, among the devices the smoke runs on
# (torch/utils/_foreach_utils.py: _get_fused_kernels_supported_devices).
FUSED_DEVICES = ("cpu", "cuda", "mps")


def preset_config(name: str, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``conf/model/<name>.yaml`` with ``overrides`` merged in (nested keys merge, so a backbone
    override keeps the preset's other backbone fields), resolved, laptrain's own keys removed:
    the constructor arguments ``train.py`` would instantiate (``laptrain.job.run.build``)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(
        _load(conf_dir() / "model" / f"{name}.yaml"), OmegaConf.create(overrides or {})
    )
    model_cfg = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(model_cfg, dict)
    for key in LAPTRAIN_KEYS:
        model_cfg.pop(key, None)
    return model_cfg


@functools.cache
def _load(path: Path) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.load(path)


def smoke_fused(model_cfg: Mapping[str, Any], kind: str, precision: str) -> dict[str, Any]:
    """``model_cfg`` with ``optimizer.fused`` as the smoke runs it on ``kind`` at ``precision``:
    the preset's value where torch has fused kernels for ``kind``, off at 16-mixed on MPS."""
    optimizer = model_cfg.get("optimizer")
    if not isinstance(optimizer, Mapping) or not optimizer.get("fused"):
        return dict(model_cfg)
    fused = kind in FUSED_DEVICES and not fused_optimizer_unsafe(kind, precision)
    return {**model_cfg, "optimizer": {**optimizer, "fused": fused}}


def smoke_checkpointing(value: Any) -> Any:
    """The preset's ``gradient_checkpointing`` as the smoke builds it: ``auto`` is ``True``."""
    return True if str(value).lower() == "auto" else value


def build_preset(
    name: str, overrides: Mapping[str, Any], kind: str, precision: str, **kwargs: Any
) -> pl.LightningModule:
    """The preset's module, instantiated as ``train.py`` does (``_convert_="all"``, ``kwargs`` as
    the datamodule's ``model_kwargs``), with the smoke rules applied (module docstring)."""
    from hydra.utils import instantiate

    model_cfg = smoke_fused(preset_config(name, overrides), kind, precision)
    if "gradient_checkpointing" in model_cfg:
        model_cfg["gradient_checkpointing"] = smoke_checkpointing(
            model_cfg["gradient_checkpointing"]
        )
    return instantiate(model_cfg, _convert_="all", **kwargs)


class TokenRows(Dataset):
    """Random token ids (``low`` and up, below ``vocab``); ``padded_from`` of the length is padding
    (id 0, mask 0) in the second half of the rows, so the mask path runs too. Labels: the first
    token modulo ``labels`` (a class), or with ``labels=None`` the ids themselves with the first
    half of each row and the padding ignored (-100: a prompt and its response)."""

    def __init__(
        self,
        rows: int,
        length: int,
        vocab: int,
        seed: int,
        labels: int | None = None,
        low: int = 2,
        padded_from: float = 0.5,
    ) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(low, vocab, (rows, length), generator=generator)
        self.mask = torch.ones_like(self.ids)
        self.mask[rows // 2 :, int(padded_from * length) :] = 0
        self.ids[self.mask == 0] = 0
        if labels is not None:
            self.labels = self.ids[:, 0] % labels
        else:
            self.labels = self.ids.clone()
            self.labels[:, : length // 2] = -100
            self.labels[self.mask == 0] = -100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class RowsData(pl.LightningDataModule):
    """``train`` and ``val`` datasets served in batches of ``batch_size``, in order, through
    ``collate_fn`` (default: torch's)."""

    def __init__(
        self,
        train: Dataset,
        val: Dataset,
        batch_size: int = 8,
        collate_fn: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        super().__init__()
        self.train, self.val, self.batch_size = train, val, batch_size
        self.collate_fn = collate_fn

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size, collate_fn=self.collate_fn)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size, collate_fn=self.collate_fn)
