"""What a run prints: the libraries' own chatter held back (each line by its exact text or its own
switch, so a new message still shows; docs/lightning.md lists them with their sources), a run's
closing lines, the exception chain one-line errors are read from, and the question after a first
Ctrl-C."""

from __future__ import annotations

import contextlib
import logging
import re
import shlex
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

# Lightning's info lines that describe Lightning rather than the run; the run's own summary lines,
# the resume line and the closing lines say what matters (accelerator, checkpoint, why it stopped).
LIGHTNING_CHATTER = re.compile(
    r"^(GPU available: |TPU available: |💡 Tip: |`Trainer\(\w+=1(\.0)?\)` was configured so "
    r"|Loading `train_dataloader` to estimate number of stepping batches\."
    r"|`Trainer\.fit` stopped: `max_(steps|epochs)=\S+` reached\.$"
    r"|Restoring states from the checkpoint path at |Restored all states from the checkpoint at "
    r"|Loaded model weights from the checkpoint at |LOCAL_RANK: \d+ - CUDA_VISIBLE_DEVICES: )"
)
LIGHTNING_LOGGERS = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
)
# torch 2.10+ deprecates ``isinstance(x, LeafSpec)``; Lightning 2.6's _pytree.py still does it on
# every fit and test. Only this message from only that module is ignored.
LEAFSPEC_MESSAGE = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
LEAFSPEC_MODULE = r"lightning\.pytorch\.utilities\._pytree"
# transformers 5 deprecates ``model.is_gradient_checkpointing``; peft's PeftModel reads it on every
# wrap (peft/peft_model.py, 0.21: ``getattr(model, "is_gradient_checkpointing", True)``).
CHECKPOINTING_MESSAGE = r"`is_gradient_checkpointing` is deprecated"
CHECKPOINTING_MODULE = r"transformers\.modeling_utils"


class LightningChatter(logging.Filter):
    """Drops the Lightning info lines matched by :data:`LIGHTNING_CHATTER`; warnings pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.INFO or not LIGHTNING_CHATTER.match(record.getMessage())


@contextlib.contextmanager
def logger_level(name: str, level: int) -> Iterator[None]:
    """The ``name`` logger at ``level`` for the block, then its own level back."""
    logger = logging.getLogger(name)
    before = logger.level
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


def quiet_libraries() -> None:
    """Hold back the known library lines (idempotent: a sweep calls it once per job)."""
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, LightningChatter) for f in logger.filters):
            logger.addFilter(LightningChatter())
    warnings.filterwarnings(
        "ignore", message=LEAFSPEC_MESSAGE, category=FutureWarning, module=LEAFSPEC_MODULE
    )
    warnings.filterwarnings(
        "ignore", message=CHECKPOINTING_MESSAGE, category=FutureWarning, module=CHECKPOINTING_MODULE
    )
    # "generated new fontManager" (INFO) the first time matplotlib runs on a machine
    logging.getLogger("matplotlib.font_manager").setLevel(logging.WARNING)


@contextlib.contextmanager
def no_transformers_bars() -> Iterator[None]:
    """transformers' tqdm bars off (``save_pretrained``'s "Writing model shards"), then restored."""
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def parameter_line(model: Any) -> str:
    """``model: <class>, 1.5 M parameters (all trainable)``: Lightning's summary table in one line."""
    from lightning.pytorch.utilities.model_summary import get_human_readable_count

    total = trainable = 0
    for p in model.parameters():
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    inner = getattr(model, "model", None)
    name = type(inner).__name__ if inner is not None else type(model).__name__
    share = (
        "all trainable"
        if trainable == total
        else f"{get_human_readable_count(trainable).strip()} trainable"
    )
    return f"model: {name}, {get_human_readable_count(total).strip()} parameters ({share})"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def metric_lines(metrics: Mapping[str, float]) -> list[str]:
    """One line per stage (``val: acc 0.6045 · f1 0.5307 · loss 1.32``); learning rates and the
    ``hp/`` copies of metrics (TensorBoard's hparams view) left out."""
    stages: dict[str, list[str]] = {}
    for key in sorted(metrics):
        stage, _, name = key.rpartition("/")
        if not stage or key.startswith(("lr-", "hp/")):  # the lr and TensorBoard's hparams copies
            continue
        stages.setdefault(stage, []).append(f"{name} {_fmt(metrics[key])}")
    known = [s for s in ("test", "val", "train") if s in stages]
    order = known + sorted(s for s in stages if s not in known)
    return [f"{stage}: " + " · ".join(stages[stage]) for stage in order]


def best_checkpoint(trainer: Any) -> tuple[str, str, float] | None:
    """(path, monitored metric, score) of the best checkpoint so far, if a callback ranks them."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    for cb in trainer.callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.monitor and cb.best_model_path:
            score = cb.best_model_score
            return (
                cb.best_model_path,
                cb.monitor,
                float(score) if score is not None else float("nan"),
            )
    return None


def shell_command(words: list[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


def relative(path: str | Path) -> str:
    """``path`` relative to the working directory when it is under it (shorter to read and type)."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def exception_chain(err: BaseException) -> list[BaseException]:
    """``err`` and every exception behind it (``__cause__`` and ``__context__``), each once."""
    found: list[BaseException] = []
    todo: list[BaseException | None] = [err]
    while todo:
        current = todo.pop(0)
        if current is None or any(current is seen for seen in found):
            continue
        found.append(current)
        todo += [current.__cause__, current.__context__]
    return found


def ask_to_stop(
    stream: IO[str], seconds: float, stopped: Callable[[], bool], poll_s: float = 0.2
) -> bool:
    """Wait up to ``seconds`` for a reply on ``stream`` (a terminal): True for ``y``/``yes``, or
    when ``stopped()`` turns true meanwhile (a second Ctrl-C); False for any other reply or none.
    ``select`` on the stream, so training resumes on the reply rather than at the deadline."""
    import select
    import time

    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if stopped():
            return True
        ready, _, _ = select.select([stream], [], [], min(poll_s, left))
        if ready:
            return stream.readline().strip().lower() in ("y", "yes")
    return stopped()
