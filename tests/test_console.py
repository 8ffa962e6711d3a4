"""laptrain.console: Lightning's chatter and the LeafSpec warning held back, nothing else."""

from __future__ import annotations

import logging
import warnings

import lightning
import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from packaging.version import Version

from laptrain.console import (
    LIGHTNING_LOGGERS,
    LightningChatter,
    metric_lines,
    no_transformers_bars,
    parameter_line,
    quiet_libraries,
)
from laptrain.families.classifier.tiny_bert import tiny_bert_classifier


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lightning_lines():
    """Lightning's info lines, as a process that never called quiet_libraries prints them: the
    filters an earlier test's run or command (doctor, bench) installed are set aside, then put
    back."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    saved = [list(logger.filters) for logger in loggers]
    for logger in loggers:
        logger.filters[:] = [f for f in logger.filters if not isinstance(f, LightningChatter)]
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    handler = Lines()
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
    for each, filters in zip(loggers, saved, strict=True):
        each.filters[:] = filters


def fit_and_test(quiet: bool) -> list[str]:
    """Lightning's warnings during a short fit and test (quiet_libraries called first or not)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if quiet:
            quiet_libraries()
        trainer = pl.Trainer(
            accelerator="cpu",
            max_steps=2,
            limit_val_batches=1,
            limit_test_batches=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        trainer.fit(BoringModel())
        trainer.test(trainer.lightning_module, verbose=False)
    return [str(w.message) for w in caught]


def test_a_fit_prints_lightning_s_chatter_and_the_leafspec_warning(lightning_lines):
    # the control: what quiet_libraries removes is there without it (Lightning 2.6, torch 2.13)
    if Version(lightning.__version__) < Version("2.6.6"):
        pytest.skip("the control is for Lightning 2.6.6; 2.6.0 (the floor) prints less of it")
    warned = fit_and_test(quiet=False)
    assert any("LeafSpec" in w for w in warned)
    assert any(line.startswith("GPU available") for line in lightning_lines)
    assert any(line.startswith("💡 Tip") for line in lightning_lines)


def test_quiet_libraries_holds_back_exactly_the_known_lines(lightning_lines):
    warned = fit_and_test(quiet=True)
    assert not [w for w in warned if "LeafSpec" in w]
    assert lightning_lines == []
    # a warning, and a line Lightning may add one day, still pass
    chatter = LightningChatter()
    record = logging.LogRecord("x", logging.WARNING, "", 0, "GPU available: True (mps)", None, None)
    assert chatter.filter(record)
    record = logging.LogRecord("x", logging.INFO, "", 0, "Something new happened", None, None)
    assert chatter.filter(record)
    # warnings from elsewhere are untouched
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_libraries()
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated", FutureWarning, stacklevel=1)
    assert len(caught) == 1


def test_metric_lines_group_by_stage_and_leave_out_the_learning_rate():
    lines = metric_lines(
        {
            "val/acc": 0.61234,
            "test/acc": 0.6,
            "train/loss": 0.2,
            "lr-AdamW/pg1": 1e-5,
            "hp/best_val_acc": 0.7,
            "step": 3,
        }
    )
    assert lines == ["test: acc 0.6", "val: acc 0.6123", "train: loss 0.2"]


def test_parameter_line_counts_trainable_parameters():
    model = tiny_bert_classifier(num_labels=2)
    total = sum(p.numel() for p in model.parameters())
    assert parameter_line(model) == (
        f"model: BertForSequenceClassification, {total / 1000:.1f} K parameters (all trainable)"
    )
    for p in model.bert.parameters():
        p.requires_grad = False
    assert parameter_line(model).endswith(" parameters (66 trainable)")  # the 32 x 2 + 2 head


def test_transformers_bars_come_back_after_the_export():
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    with no_transformers_bars():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()
