"""What a ``laptrain doctor`` check returns (:class:`Check`) and the quiet few-step Trainer the
training checks fit on, the doctor's own and a family's (``Family.doctor_check``)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False
    memory: bool = False  # failed because the job does not fit memory (an OOM, the preflight)

    def line(self) -> str:
        mark = "ok  " if self.ok and not self.warning else ("warn" if self.ok else "FAIL")
        return f"[{mark}] {self.name}: {self.detail}" + (f" -> {self.fix}" if self.fix else "")


@contextlib.contextmanager
def lightning_quiet() -> Iterator[None]:
    """Lightning's "GPU available" / tips lines would bury the report; the level is restored
    afterwards (the doctor may run inside another program, or a test session)."""
    from laptrain.console import logger_level

    with logger_level("lightning.pytorch", logging.WARNING):
        yield


def quiet_trainer(kind: str, precision: str, **kw: Any) -> Any:
    """A Trainer for 3 steps on one device, with no logger, checkpoints, progress bar or summary."""
    import lightning.pytorch as pl

    return pl.Trainer(
        accelerator=kind,
        devices=1,
        precision=precision,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kw,
    )
