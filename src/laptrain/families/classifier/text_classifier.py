"""Sequence classification with a transformers encoder (SciBERT-style), as a LightningModule.

The backbone comes from a pretrained name or folder (``pretrained``: the hub on a user's machine,
or a folder written by ``save_pretrained``) or is built from scratch from a transformers config
(``backbone``: ``model_type`` plus config fields), which is the offline default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    get_linear_schedule_with_warmup,
)

from laptrain.model.chunked_backward import ChunkedBackward
from laptrain.model.fsdp_units import inner_state_dict
from laptrain.model.gradient_checkpointing import parse_setting, replay_device_rng, switch_on
from laptrain.pretrained.loading import Source, load_pretrained_model

from .first_token import first_token_only

OptimizerFactory = Callable[[Iterable[Any]], torch.optim.Optimizer]


def build_classifier(
    num_labels: int,
    pretrained: Source | None = None,
    backbone: dict[str, Any] | None = None,
    label_names: list[str] | None = None,
    vocab_size: int | None = None,
    pad_token_id: int | None = None,
) -> torch.nn.Module:
    """An ``AutoModelForSequenceClassification`` from ``pretrained`` or from a config dict.

    Loaded in float32 whatever dtype the checkpoint was saved in: transformers 5 defaults to
    ``dtype="auto"`` (the checkpoint's), so a float16 hub checkpoint became float16 master weights
    that the optimizer updated in 16 bits. The precision setting (``16-mixed``, ``bf16-true``)
    decides what the compute runs in; Lightning casts for it."""
    names = list(label_names) if label_names else [str(i) for i in range(num_labels)]
    labels = {
        "num_labels": num_labels,
        "id2label": dict(enumerate(names)),
        "label2id": {n: i for i, n in enumerate(names)},
    }
    if pretrained:
        return load_pretrained_model(
            partial(
                AutoModelForSequenceClassification.from_pretrained,
                ignore_mismatched_sizes=True,
                dtype=torch.float32,
                **labels,
            ),
            pretrained,
            "set model.pretrained to a folder written by save_pretrained, or use model=tiny_classifier offline",
        )
    if not backbone or "model_type" not in backbone:
        raise ValueError(
            "set model.pretrained=<name or folder> or model.backbone.model_type (e.g. bert)"
        )
    fields = {k: v for k, v in backbone.items() if k != "model_type"}
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    if pad_token_id is not None:
        fields["pad_token_id"] = pad_token_id
    config = AutoConfig.for_model(backbone["model_type"], **fields, **labels)
    return AutoModelForSequenceClassification.from_config(config)


class TextClassifierModule(ChunkedBackward, pl.LightningModule):
    """Fine-tune or train a text classifier; logs loss, accuracy and macro-F1 per stage.

    The training step back-propagates through ``ChunkedBackward``, so that with the ``oom_backoff``
    callback an out-of-memory error halves the micro-batch instead of ending the run.

    Args:
        num_labels, label_names, vocab_size, pad_token_id: from the datamodule (``model_kwargs``).
        pretrained: hub name, local folder, ``.gguf`` file or pinned wheel member
            (``laptrain.pretrained.sources``); wins over ``backbone``.
        backbone: transformers config fields incl. ``model_type``, for a from-scratch model.
        optimizer: a factory (Hydra ``_partial_: true``) taking parameter groups.
        warmup_ratio: share of the optimizer steps with a linear warm-up, then linear decay to 0.
        gradient_checkpointing: recompute activations in backward instead of keeping them: less
            memory (the preflight's first fix for long sequences), about a third more compute;
            ``auto``: off unless the preflight finds the job does not fit without it.
        last_layer_first_token: compute the last encoder layer for the first token only, the one
            the head reads (``laptrain.families.classifier.first_token``; same logits, less work).
            Models it does not apply to are left as they are.
    """

    def __init__(
        self,
        num_labels: int,
        pretrained: Source | None = None,
        backbone: dict[str, Any] | None = None,
        label_names: list[str] | None = None,
        vocab_size: int | None = None,
        pad_token_id: int | None = None,
        optimizer: OptimizerFactory | None = None,
        warmup_ratio: float = 0.1,
        gradient_checkpointing: bool | Literal["auto"] = False,
        last_layer_first_token: bool = True,
    ) -> None:
        super().__init__()
        if num_labels < 2:
            raise ValueError(f"need at least 2 labels, found {num_labels}: check data.label_column")
        if not 0 <= warmup_ratio < 1:
            raise ValueError(f"model.warmup_ratio must be in [0, 1) (got {warmup_ratio})")
        backbone = dict(backbone) if backbone else None
        self.save_hyperparameters(ignore=["optimizer"])
        self.model = build_classifier(
            num_labels, pretrained, backbone, label_names, vocab_size, pad_token_id
        )
        self.first_token_only = bool(last_layer_first_token) and first_token_only(self.model)
        self.checkpointing_setting = parse_setting(gradient_checkpointing)
        self.gradient_checkpointing = self.checkpointing_setting is True
        if self.gradient_checkpointing:  # auto: off until the preflight says otherwise
            self._checkpoint_backbone()
        self.optimizer_factory = optimizer or partial(torch.optim.AdamW, lr=5e-4, weight_decay=0.01)
        self.warmup_ratio = warmup_ratio
        self.metrics = torch.nn.ModuleDict(
            {
                f"{stage}_{name}": metric
                for stage in ("val", "test")
                for name, metric in (
                    ("acc", MulticlassAccuracy(num_labels, average="micro")),
                    ("f1", MulticlassF1Score(num_labels, average="macro")),
                )
            }
        )

    def use_gradient_checkpointing(self) -> None:
        """Turn gradient checkpointing on after the fact (``gradient_checkpointing: auto`` when the
        preflight finds that the job does not fit without it)."""
        if not self.gradient_checkpointing:
            self._checkpoint_backbone()
            self.gradient_checkpointing = True

    def _checkpoint_backbone(self) -> None:
        """transformers' checkpointing with its default kwargs; on MPS the recompute replays the
        forward's dropout masks (``laptrain.model.gradient_checkpointing.replay_device_rng``)."""
        switch_on(self.model)
        replay_device_rng(self.model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        # the loss is a mean over samples, so chunks weighted by their size add up to it
        loss = self.chunked_backward(batch, lambda chunk: self.model(**chunk).loss)
        self.log(
            "train/loss", loss, on_step=True, prog_bar=True, batch_size=batch["labels"].shape[0]
        )
        return loss

    def _eval_step(self, stage: str, batch: dict[str, torch.Tensor]) -> None:
        out = self.model(**batch)
        preds = out.logits.argmax(-1)
        size = batch["labels"].shape[0]
        # sync_dist: averaged over the ranks at the epoch's end, as the metrics below are
        self.log(
            f"{stage}/loss", out.loss, batch_size=size, prog_bar=stage == "val", sync_dist=True
        )
        for name in ("acc", "f1"):
            metric = self.metrics[f"{stage}_{name}"]
            metric(preds, batch["labels"])
            self.log(f"{stage}/{name}", metric, batch_size=size, prog_bar=stage == "val")

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("val", batch)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step("test", batch)

    def configure_optimizers(self) -> dict[str, Any]:
        decay, no_decay = [], []
        for param in self.model.parameters():
            if param.requires_grad:
                # Biases and norm weights are not decayed (the usual BERT recipe).
                (decay if param.ndim >= 2 else no_decay).append(param)
        optimizer = self.optimizer_factory(
            [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        )
        total = max(1, int(self.trainer.estimated_stepping_batches))
        scheduler = get_linear_schedule_with_warmup(
            optimizer, int(total * self.warmup_ratio), total
        )
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    export_folder = "model"  # run.py writes the final model to <run>/model/

    def export(self, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
        """Write the transformers model with ``save_pretrained`` (loadable without laptrain).
        ``state_dict``: this module's weights to write instead of its own (under FSDP its
        parameters are shards: ``laptrain.model.fsdp_units.whole_state_dict``)."""
        weights = inner_state_dict(state_dict, "model")  # None: transformers reads the model's own
        self.model.save_pretrained(str(folder), state_dict=weights)
