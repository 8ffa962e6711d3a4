"""A user's own project, written the lightning-hydra-template way, outside src/laptrain.

:func:`write_user_project` writes ``mytask.py`` (a plain LightningModule and a LightningDataModule
with ``self.save_hyperparameters()``, loaders built with ``batch_size=self.hparams.batch_size``, a
plain ``DataLoader(shuffle=True)``) and ``conf/model/mlp.yaml`` + ``conf/data/blobs.yaml`` into a
folder; :func:`user_args` and :func:`user_env` are what ``train.py`` is run with to find them.
"""

from __future__ import annotations

import os
from pathlib import Path

MYTASK = '''
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class MLPModule(pl.LightningModule):
    def __init__(self, hidden: int = 16, lr: float = 0.01, stage_name: str = "val"):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 3))

    def forward(self, x):
        return self.net(x)

    def _step(self, batch, stage):
        x, y = batch
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y)
        sync = stage != "train"  # validation and test metrics averaged over DDP ranks
        self.log(f"{stage}/loss", loss, sync_dist=sync)
        self.log(f"{stage}/acc", (logits.argmax(-1) == y).float().mean(), sync_dist=sync)
        return loss

    def training_step(self, batch, batch_idx):
        return self._step(batch, "train")

    def validation_step(self, batch, batch_idx):
        self._step(batch, self.hparams.stage_name)

    def test_step(self, batch, batch_idx):
        self._step(batch, "test")

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def blobs(rows):
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (rows,), generator=g)
    x = torch.randn(rows, 8, generator=g) + y[:, None].float() * 2
    cut, end = rows * 8 // 10, rows * 9 // 10
    return (TensorDataset(x[:cut], y[:cut]), TensorDataset(x[cut:end], y[cut:end]),
            TensorDataset(x[end:], y[end:]))


class BlobsDataModule(pl.LightningDataModule):
    def __init__(self, rows: int = 300, batch_size: int = 32, num_workers: int = 0,
                 pin_memory: bool = False):
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage=None):
        self.train_set, self.val_set, self.test_set = blobs(self.hparams.rows)

    def _loader(self, data, shuffle=False):
        return DataLoader(data, batch_size=self.hparams.batch_size, shuffle=shuffle,
                          num_workers=self.hparams.num_workers,
                          pin_memory=self.hparams.pin_memory)

    def train_dataloader(self):
        return self._loader(self.train_set, shuffle=True)

    def val_dataloader(self):
        return self._loader(self.val_set)

    def test_dataloader(self):
        return self._loader(self.test_set)


class FixedBatchDataModule(pl.LightningDataModule):
    """Builds its loaders with a batch of its own: nothing the profile's batch could be set on."""

    def __init__(self, rows: int = 300):
        super().__init__()
        self.rows = rows

    def setup(self, stage=None):
        self.train_set, self.val_set, self.test_set = blobs(self.rows)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=16)

    def test_dataloader(self):
        return DataLoader(self.test_set, batch_size=16)


class NotAModule(nn.Module):
    def __init__(self, hidden: int = 16, lr: float = 0.01):
        super().__init__()
'''

MLP_YAML = "_target_: mytask.MLPModule\nhidden: 16\nlr: 0.01\n"
BLOBS_YAML = "_target_: mytask.BlobsDataModule\nrows: 300\nbatch_size: 32\n"
FIXED_YAML = "_target_: mytask.FixedBatchDataModule\nrows: 300\n"

# A fast run of the user's module: CPU, one epoch, no logger files.
FAST = ["hardware=cpu", "trainer.max_epochs=1", "logger=none"]


def write_user_project(folder: Path) -> Path:
    """``mytask.py`` and its presets (model=mlp, data=blobs, data=fixed_batch) in ``folder``."""
    (folder / "conf" / "model").mkdir(parents=True, exist_ok=True)
    (folder / "conf" / "data").mkdir(parents=True, exist_ok=True)
    (folder / "mytask.py").write_text(MYTASK)
    (folder / "conf" / "model" / "mlp.yaml").write_text(MLP_YAML)
    (folder / "conf" / "data" / "blobs.yaml").write_text(BLOBS_YAML)
    (folder / "conf" / "data" / "fixed_batch.yaml").write_text(FIXED_YAML)
    return folder


def user_args(folder: Path) -> list[str]:
    """The overrides that add the project's presets to laptrain's conf/."""
    return [f"hydra.searchpath=[file://{folder / 'conf'}]"]


def user_env(folder: Path) -> dict[str, str]:
    """The environment that makes ``mytask`` importable."""
    return {
        "PYTHONPATH": os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    }
