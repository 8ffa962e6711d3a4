"""A user's project written exactly as lightning-hydra-template's MNIST example, outside
src/laptrain: ``user/lht_task/`` holds ``SimpleDenseNet``, ``MNISTLitModule`` (the network passed in
as an object, the optimizer and scheduler as ``_partial_: true`` objects kept by
``save_hyperparameters(logger=False)``, ReduceLROnPlateau on ``val/loss``, torchmetrics) and
``MNISTDataModule`` (``batch_size`` divided by ``trainer.world_size`` into
``batch_size_per_device`` in ``setup``), with small random tensors for MNIST (no network);
``conf/model/lht_mnist.yaml`` and ``conf/data/lht_mnist.yaml`` are its presets.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import ROOT

PYTHONPATH = os.environ.get("PYTHONPATH")  # the laptrain under test, where it is not installed

NET = """
from torch import nn


class SimpleDenseNet(nn.Module):
    def __init__(self, input_size=784, lin1_size=256, lin2_size=256, lin3_size=256,
                 output_size=10):
        super().__init__()
        self.model = nn.Sequential(
            nn.Linear(input_size, lin1_size),
            nn.BatchNorm1d(lin1_size),
            nn.ReLU(),
            nn.Linear(lin1_size, lin2_size),
            nn.BatchNorm1d(lin2_size),
            nn.ReLU(),
            nn.Linear(lin2_size, lin3_size),
            nn.BatchNorm1d(lin3_size),
            nn.ReLU(),
            nn.Linear(lin3_size, output_size),
        )

    def forward(self, x):
        batch_size, channels, width, height = x.size()
        x = x.view(batch_size, -1)
        return self.model(x)
"""

MODULE = """
from typing import Any, Dict, Tuple

import torch
from lightning import LightningModule
from torchmetrics import MaxMetric, MeanMetric
from torchmetrics.classification.accuracy import Accuracy


class MNISTLitModule(LightningModule):
    def __init__(self, net: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 scheduler: torch.optim.lr_scheduler, compile: bool) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = net
        self.criterion = torch.nn.CrossEntropyLoss()
        self.train_acc = Accuracy(task="multiclass", num_classes=10)
        self.val_acc = Accuracy(task="multiclass", num_classes=10)
        self.test_acc = Accuracy(task="multiclass", num_classes=10)
        self.train_loss = MeanMetric()
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self.val_acc_best = MaxMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def on_train_start(self) -> None:
        self.val_loss.reset()
        self.val_acc.reset()
        self.val_acc_best.reset()

    def model_step(self, batch: Tuple[torch.Tensor, torch.Tensor]):
        x, y = batch
        logits = self.forward(x)
        loss = self.criterion(logits, y)
        preds = torch.argmax(logits, dim=1)
        return loss, preds, y

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss, preds, targets = self.model_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def on_train_epoch_end(self) -> None:
        pass

    def validation_step(self, batch, batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.val_loss(loss)
        self.val_acc(preds, targets)
        self.log("val/loss", self.val_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_validation_epoch_end(self) -> None:
        acc = self.val_acc.compute()
        self.val_acc_best(acc)
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(self, batch, batch_idx: int) -> None:
        loss, preds, targets = self.model_step(batch)
        self.test_loss(loss)
        self.test_acc(preds, targets)
        self.log("test/loss", self.test_loss, on_step=False, on_epoch=True, prog_bar=True)
        self.log("test/acc", self.test_acc, on_step=False, on_epoch=True, prog_bar=True)

    def on_test_epoch_end(self) -> None:
        pass

    def setup(self, stage: str) -> None:
        if self.hparams.compile and stage == "fit":
            self.net = torch.compile(self.net)

    def configure_optimizers(self) -> Dict[str, Any]:
        optimizer = self.hparams.optimizer(params=self.trainer.model.parameters())
        if self.hparams.scheduler is not None:
            scheduler = self.hparams.scheduler(optimizer=optimizer)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {
                    "scheduler": scheduler,
                    "monitor": "val/loss",
                    "interval": "epoch",
                    "frequency": 1,
                },
            }
        return {"optimizer": optimizer}
"""

DATA = '''
from typing import Any, Dict, Optional, Tuple

import torch
from lightning import LightningDataModule
from torch.utils.data import DataLoader, Dataset, TensorDataset, random_split


def random_digits(rows: int) -> TensorDataset:
    """MNIST's shapes, made in memory: 10 classes of 1x28x28 images, each a noisy class mean."""
    g = torch.Generator().manual_seed(0)
    means = torch.randn(10, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (rows,), generator=g)
    x = means[y] + 0.5 * torch.randn(rows, 1, 28, 28, generator=g)
    return TensorDataset(x, y)


class MNISTDataModule(LightningDataModule):
    def __init__(self, data_dir: str = "data/",
                 train_val_test_split: Tuple[int, int, int] = (320, 64, 64),
                 batch_size: int = 64, num_workers: int = 0, pin_memory: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.data_train: Optional[Dataset] = None
        self.data_val: Optional[Dataset] = None
        self.data_test: Optional[Dataset] = None
        self.batch_size_per_device = batch_size

    @property
    def num_classes(self) -> int:
        return 10

    def prepare_data(self) -> None:
        pass

    def setup(self, stage: Optional[str] = None) -> None:
        # Divide batch size by the number of devices.
        if self.trainer is not None:
            if self.hparams.batch_size % self.trainer.world_size != 0:
                raise RuntimeError(
                    f"Batch size ({self.hparams.batch_size}) is not divisible by the number of "
                    f"devices ({self.trainer.world_size})."
                )
            self.batch_size_per_device = self.hparams.batch_size // self.trainer.world_size

        # load and split datasets only if not loaded already
        if not self.data_train and not self.data_val and not self.data_test:
            dataset = random_digits(sum(self.hparams.train_val_test_split))
            self.data_train, self.data_val, self.data_test = random_split(
                dataset=dataset,
                lengths=self.hparams.train_val_test_split,
                generator=torch.Generator().manual_seed(42),
            )

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_train,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=True,
        )

    def val_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_val,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=False,
        )

    def test_dataloader(self) -> DataLoader[Any]:
        return DataLoader(
            dataset=self.data_test,
            batch_size=self.batch_size_per_device,
            num_workers=self.hparams.num_workers,
            pin_memory=self.hparams.pin_memory,
            shuffle=False,
        )

    def teardown(self, stage: Optional[str] = None) -> None:
        pass

    def state_dict(self) -> Dict[Any, Any]:
        return {}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        pass
'''

MODEL_YAML = """_target_: user.lht_task.mnist_module.MNISTLitModule

optimizer:
  _target_: torch.optim.Adam
  _partial_: true
  lr: 0.001
  weight_decay: 0.0

scheduler:
  _target_: torch.optim.lr_scheduler.ReduceLROnPlateau
  _partial_: true
  mode: min
  factor: 0.1
  patience: 10

net:
  _target_: user.lht_task.components.simple_dense_net.SimpleDenseNet
  input_size: 784
  lin1_size: 16
  lin2_size: 16
  lin3_size: 16
  output_size: 10

# compile model for faster training with pytorch 2.0
compile: false
"""

DATA_YAML = """_target_: user.lht_task.mnist_datamodule.MNISTDataModule
data_dir: data/
batch_size: 32 # Needs to be divisible by the number of devices (e.g., if in a distributed setup)
train_val_test_split: [320, 64, 64]
num_workers: 0
pin_memory: False
"""

# model=lht_mnist data=lht_mnist on the CPU, one torch thread, no logger files.
ARGS = ["model=lht_mnist", "data=lht_mnist", "hardware=cpu", "hardware.torch_threads=1"]


def write_lht_project(folder: Path) -> list[str]:
    """The project in ``folder`` (``user/lht_task/`` and its presets); returns the train.py
    arguments that pick it."""
    package = folder / "user" / "lht_task"
    (package / "components").mkdir(parents=True, exist_ok=True)
    for init in (folder / "user", package, package / "components"):
        (init / "__init__.py").write_text("")
    (package / "components" / "simple_dense_net.py").write_text(NET)
    (package / "mnist_module.py").write_text(MODULE)
    (package / "mnist_datamodule.py").write_text(DATA)
    for group, text in (("model", MODEL_YAML), ("data", DATA_YAML)):
        (folder / "conf" / group).mkdir(parents=True, exist_ok=True)
        (folder / "conf" / group / "lht_mnist.yaml").write_text(text)
    return [*ARGS, f"hydra.searchpath=[file://{folder / 'conf'}]", "logger=none"]


def lht_env(folder: Path) -> dict[str, str]:
    """The environment a train.py process needs: ``user.lht_task``, and ``tests`` (signals)."""
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(folder), str(ROOT), PYTHONPATH]))}
