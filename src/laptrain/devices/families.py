"""Each model family at smoke-test size, for the device smoke test and the device harness.

An entry is how to build a fresh module and datamodule and how to predict one batch; which
precisions the family refuses comes from the family registry (:mod:`laptrain.model.families`),
the same rule the launch applies. Entries are keyed by the registry's family names; a new family
adds its tiny build here (or calls :func:`register`) and ``benchmarks/device_smoke.py`` picks it up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from laptrain.model.families import FAMILIES as MODEL_FAMILIES

Build = Callable[[int, int], tuple[pl.LightningModule, pl.LightningDataModule]]
Predict = Callable[[pl.LightningModule, Any], torch.Tensor]


def _registry_refusal(name: str) -> Callable[[str, str], str | None]:
    """The registry's precision rule of family ``name`` (none for a family it does not know)."""

    def refuse(kind: str, precision: str) -> str | None:
        family = MODEL_FAMILIES.get(name)
        return family.refusal(kind, precision) if family else None

    return refuse


@dataclass(frozen=True)
class Family:
    """One model family at smoke-test size.

    Attributes:
        name: the row label in the table.
        build: ``build(seed, steps)`` -> a fresh (module, datamodule) whose training epoch is
            ``steps`` batches, with validation data; the same seed gives the same weights.
        predict: ``predict(module, batch)`` -> predictions for one validation batch (on the device).
        refuse: ``refuse(device_kind, precision)`` -> why the family does not run there, or None
            (default: the registry's rule for ``name``).
        callbacks: extra callbacks the family trains with (its ``configure_callbacks`` are added
            by Lightning itself).
    """

    name: str
    build: Build
    predict: Predict
    refuse: Callable[[str, str], str | None] | None = None
    callbacks: Callable[[], list[pl.Callback]] = field(default=list)

    def refusal(self, kind: str, precision: str) -> str | None:
        """Why this family does not run at ``precision`` on ``kind``, or None."""
        return (self.refuse or _registry_refusal(self.name))(kind, precision)


# ----- text classifier ----------------------------------------------------------------------
class _TokenDataset(Dataset):
    """Random token ids whose label is the first token modulo the number of labels."""

    def __init__(self, rows: int, length: int, vocab: int, labels: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(2, vocab, (rows, length), generator=generator)
        self.mask = torch.ones_like(self.ids)
        self.mask[rows // 2 :, length // 2 :] = 0  # half the rows padded: the mask path runs too
        self.ids[self.mask == 0] = 0
        self.labels = self.ids[:, 0] % labels

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class _TokenData(pl.LightningDataModule):
    def __init__(self, steps: int, batch_size: int = 8, length: int = 16, vocab: int = 64) -> None:
        super().__init__()
        self.train = _TokenDataset(steps * batch_size, length, vocab, labels=3, seed=1)
        self.val = _TokenDataset(batch_size, length, vocab, labels=3, seed=2)
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train, batch_size=self.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val, batch_size=self.batch_size)


def _build_classifier(seed: int, steps: int) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    from laptrain.model.classifier.text_classifier import TextClassifierModule
    from laptrain.model.classifier.tiny_bert import tiny_bert_backbone

    backbone = tiny_bert_backbone(max_position_embeddings=32)
    torch.manual_seed(seed)
    module = TextClassifierModule(num_labels=3, backbone=backbone, vocab_size=64, pad_token_id=0)
    return module, _TokenData(steps)


def _predict_classifier(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return module(batch["input_ids"], batch["attention_mask"]).argmax(-1)


# ----- TRM ----------------------------------------------------------------------------------
def _trm_sizes() -> dict[str, dict[str, Any]]:
    import yaml

    from laptrain.project import conf_dir

    sizes = yaml.safe_load((Path(conf_dir()) / "model" / "trm_sudoku.yaml").read_text())["sizes"]
    return {"tiny": {**sizes["tiny"], "hidden_size": 32, "n_sup": 3, "warmup_steps": 2}}


def _build_trm(seed: int, steps: int) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    from laptrain.data.sudoku import SudokuDataModule
    from laptrain.model.trm import TRMSudokuModule

    data = SudokuDataModule(
        board_size=4,
        givens=(5, 8),
        train_size=32,
        val_size=8,
        test_size=8,
        batch_size=8,
        eval_batch_size=8,
        steps_per_epoch=steps,
        seed=3,
    )
    data.prepare_data()
    torch.manual_seed(seed)
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=_trm_sizes())
    with torch.no_grad():  # a halt head that fires for some slots: slots at different depths
        module.model.halt_head.bias.fill_(0.0)
        module.model.halt_head.weight.normal_(0.0, 1.0)
    return module, data


def _predict_trm(module: pl.LightningModule, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return module.solve(batch["inputs"])["pred"]


FAMILIES: dict[str, Family] = {
    "classifier": Family("classifier", _build_classifier, _predict_classifier),
    "trm": Family("trm", _build_trm, _predict_trm),
}


def register(family: Family) -> None:
    """Add (or replace) a family in the registry."""
    FAMILIES[family.name] = family


# ----- causal-LM LoRA -----------------------------------------------------------------------
class _PromptResponseDataset(Dataset):
    """Random token rows: the first half is the prompt (labels -100), the rest the response;
    half the rows end in padding (mask 0, labels -100)."""

    def __init__(self, rows: int, length: int, vocab: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(3, vocab, (rows, length), generator=generator)
        self.mask = torch.ones_like(self.ids)
        self.mask[rows // 2 :, 3 * length // 4 :] = 0
        self.ids[self.mask == 0] = 0
        self.labels = self.ids.clone()
        self.labels[:, : length // 2] = -100
        self.labels[self.mask == 0] = -100

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": self.mask[i], "labels": self.labels[i]}


class _PromptResponseData(_TokenData):
    def __init__(self, steps: int, batch_size: int = 8, length: int = 16, vocab: int = 64) -> None:
        pl.LightningDataModule.__init__(self)
        self.train = _PromptResponseDataset(steps * batch_size, length, vocab, seed=1)
        self.val = _PromptResponseDataset(batch_size, length, vocab, seed=2)
        self.batch_size = batch_size


def _build_causal_lm_lora(
    seed: int, steps: int
) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    from laptrain.model.lora.causal_lm import CausalLMLoRAModule

    backbone = {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32,
        "initializer_range": 0.3,
        "pad_token_id": 0,
    }
    torch.manual_seed(0)  # one frozen base for every seed, as a hub model would be
    module = CausalLMLoRAModule(backbone=backbone, lora={"r": 4})
    torch.manual_seed(seed)
    with torch.no_grad():  # other adapters per seed: a resume must take them from the file
        for name, param in module.named_parameters():
            if "lora_A" in name:
                param.normal_(0.0, 0.1)
    return module, _PromptResponseData(steps)


def _predict_causal_lm_lora(
    module: pl.LightningModule, batch: dict[str, torch.Tensor]
) -> torch.Tensor:
    return module(batch["input_ids"], batch["attention_mask"]).argmax(-1)


register(
    Family(
        "lora",
        _build_causal_lm_lora,
        _predict_causal_lm_lora,
    )
)
