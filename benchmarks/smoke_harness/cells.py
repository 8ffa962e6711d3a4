"""A few steps of each model family at each precision this device allows: fit, save, resume, predict.

Every fit runs with laptrain's callbacks that keep tensors (EMA, RNG state) and a
:class:`~smoke_harness.placement.PlacementCheck`, so a tensor left on the CPU, or in the old
dtype, after Lightning moved the module fails the cell with its name. It also runs the default
callbacks that call the device during a fit (:data:`GUARDS`: the memory monitor's memory reads and
cache release, the thermal guard's synchronise and source reads, the non-finite guard's gradient
check, the OOM backoff's probe), switched on and acting at every step, so a device where one of
those calls breaks fails its cell. Each family's build is its preset's (``laptrain/model/<family>/
smoke.py``), and :func:`legend_lines` says what that means on this device. One cell's failure
never stops the table. ``python benchmarks/device_smoke.py`` prints it.
"""

from __future__ import annotations

import functools
import gc
import logging
import platform
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from laptrain.callbacks.rng_state import RNGState
from laptrain.families.trm.ema import EMA
from laptrain.hardware.probe import TorchProbe
from laptrain.hardware.profile import ProfileError, validate_precision
from laptrain.project import conf_dir
from laptrain.versions import package_versions
from smoke_harness.builds import SMOKE_BUILDS, SmokeBuild
from smoke_harness.placement import PlacementCheck

# What each device is asked to run; the profile's rules (validate_precision) and the family's
# own refuse the cells they cannot run, with their reason.
PRECISIONS_BY_DEVICE = {
    "cpu": ("32-true", "bf16-mixed", "64-true", "16-mixed"),
    "cuda": ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"),
    "mps": ("32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true", "64-true"),
}


# The default callbacks (conf/callbacks/default.yaml) that call the device during a fit, read from
# their conf/callbacks/<name>.yaml (built, as in the Apple profiles) with these overrides: acting
# at every step, and no cooling break (a break changes timing only; the thermal guard still
# synchronises, reads its source and times every step).
GUARDS: dict[str, dict[str, Any]] = {
    "memory_monitor": {"every_n_steps": 1},
    "thermal_guard": {
        "check_every_n_steps": 1,
        "warmup_steps": 0,
        "baseline_steps": 1,
        "window_steps": 1,
        "max_break_seconds_per_hour": 0,
    },
    "nonfinite_guard": {},
    "oom_backoff": {"every_n_steps": 1},
}


@functools.cache
def _guard_config(name: str) -> Any:
    from omegaconf import OmegaConf

    node = OmegaConf.load(conf_dir() / "callbacks" / f"{name}.yaml")[name]
    node.pop("enabled", None)  # whether a run builds it (laptrain.callbacks.acting)
    return OmegaConf.merge(node, GUARDS[name])


def guard_callbacks() -> list[pl.Callback]:
    """Fresh :data:`GUARDS` callbacks, instantiated from their config files as a run does."""
    from hydra.utils import instantiate

    return [instantiate(_guard_config(name), _convert_="all") for name in GUARDS]


@contextmanager
def _old_objects_frozen() -> Iterator[None]:
    """The memory monitor's cleanup runs ``gc.collect()``, which on its own walks every object of
    torch, transformers and Lightning (0.2 s on 2 cores, each fit): objects that exist before the
    fit are left out of collection meanwhile (``gc.freeze``), unless someone else froze some."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def detect_device() -> str:
    """``cuda``, ``mps`` or ``cpu``: the device this machine's torch can train on."""
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def device_name(kind: str) -> str:
    """A readable name of the device (``unavailable`` when this torch cannot use it)."""
    if kind != "cpu" and not TorchProbe(kind).available():
        return "unavailable in this torch build"
    if kind == "cuda":
        return torch.cuda.get_device_name(0)
    if kind == "mps":
        return f"Apple MPS ({platform.machine()})"
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def header_lines(kind: str) -> list[str]:
    """Device, versions and OS: what a bug report needs above the table."""
    versions = package_versions()
    os_name = platform.platform()
    if platform.system() == "Darwin":
        os_name = f"macOS {platform.mac_ver()[0]} ({platform.machine()})"
    return [
        f"device: {kind} - {device_name(kind)}",
        ", ".join(f"{name} {versions.get(name, '?')}" for name in ("torch", "lightning", "python")),
        f"OS: {os_name}",
    ]


@contextmanager
def _quiet() -> Iterator[None]:
    """Lightning's per-Trainer info lines, transformers' notices and warnings would bury the table."""
    loggers = [
        logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "transformers")
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _trainer(accelerator: str, precision: str, max_steps: int, root: Path, **kw: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator=accelerator,
        devices=1,
        precision=precision,  # type: ignore[arg-type]
        max_steps=max_steps,
        max_epochs=-1,
        limit_val_batches=1,
        num_sanity_val_steps=1,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        **kw,
    )


class _Predictor(pl.LightningModule):
    """Wraps a family's module so ``trainer.predict`` moves, converts and runs it like a fit."""

    def __init__(self, module: pl.LightningModule, family: SmokeBuild) -> None:
        super().__init__()
        self.inner = module
        self._family = family

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._family.predict(self.inner, batch).detach()


def smoke_fit(
    family: SmokeBuild, precision: str, accelerator: str, steps: int, workdir: Path
) -> dict[str, Any]:
    """Fit ``steps`` steps, save, resume in a fresh Trainer for ``steps`` more, predict one batch.

    Raises whatever fails, e.g. :class:`~smoke_harness.placement.PlacementError` when a kept
    tensor did not follow the parameters. Returns the number of placement checks and predictions.
    """
    with _old_objects_frozen():
        return _fit_save_resume_predict(family, precision, accelerator, steps, workdir)


def _fit_save_resume_predict(
    family: SmokeBuild, precision: str, accelerator: str, steps: int, workdir: Path
) -> dict[str, Any]:
    def callbacks(ckpt_dir: Path) -> list[pl.Callback]:
        save = ModelCheckpoint(dirpath=ckpt_dir, save_last=True, every_n_train_steps=1)
        kept = [EMA(decay=0.9), RNGState(), *guard_callbacks(), *family.callbacks()]
        return [*kept, PlacementCheck(), save]

    module, data = family.make(0, steps, accelerator, precision)
    first = callbacks(workdir / "first")
    trainer = _trainer(accelerator, precision, steps, workdir, callbacks=first)
    trainer.fit(module, datamodule=data)
    last = trainer.checkpoint_callback.last_model_path  # type: ignore[union-attr]
    if not last or not Path(last).is_file():
        raise RuntimeError(f"no checkpoint written after {steps} steps")

    module, data = family.make(1, steps, accelerator, precision)  # weights from the file only
    second = callbacks(workdir / "second")
    trainer = _trainer(accelerator, precision, 2 * steps, workdir, callbacks=second)
    trainer.fit(module, datamodule=data, ckpt_path=last)
    if trainer.global_step != 2 * steps:
        raise RuntimeError(f"resumed fit stopped at step {trainer.global_step}, not {2 * steps}")

    predictor = _Predictor(module, family)
    trainer = _trainer(accelerator, precision, 1, workdir, limit_predict_batches=1)
    outputs = trainer.predict(predictor, dataloaders=data.val_dataloader())
    if not outputs or not isinstance(outputs[0], torch.Tensor):
        raise RuntimeError(f"predict returned {type(outputs).__name__}, not tensors")
    checks = sum(c.checks for c in (*first, *second) if isinstance(c, PlacementCheck))
    return {"placement_checks": checks, "predictions": int(outputs[0].numel())}


@dataclass
class Cell:
    """One family x precision result."""

    family: str
    precision: str
    status: str  # ok, refused, failed
    seconds: float = 0.0
    detail: str = ""
    trace: str = ""

    def text(self) -> str:
        if self.status == "ok":
            return f"ok ({self.seconds:.1f} s)"
        return f"{self.status}: {self.detail}"


def _first_line(err: BaseException) -> str:
    line = next((s for s in str(err).splitlines() if s.strip()), "")
    return f"{type(err).__name__}: {line}".rstrip(": ")


def run_cell(family: SmokeBuild, precision: str, kind: str, steps: int, workdir: Path) -> Cell:
    """Refuse, run or fail one cell; never raises (except KeyboardInterrupt)."""
    try:
        text = validate_precision(precision, kind, TorchProbe(kind).bf16_supported())
    except ProfileError as err:
        return Cell(family.name, precision, "refused", detail=str(err))
    reason = family.refusal(kind, text)
    if reason:
        return Cell(family.name, precision, "refused", detail=reason)
    start = time.perf_counter()
    try:
        with _quiet():
            smoke_fit(family, text, kind, steps, workdir)
    except Exception as err:  # one cell's failure is a table entry, not the end of the table
        return Cell(
            family.name,
            precision,
            "failed",
            time.perf_counter() - start,
            _first_line(err),
            traceback.format_exc(),
        )
    return Cell(family.name, precision, "ok", time.perf_counter() - start)


def run_smoke(
    families: Iterable[str] | None = None,
    precisions: Sequence[str] | None = None,
    steps: int = 2,
    kind: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[Cell]:
    """Every family x precision cell on ``kind`` (default: this machine's device); ``progress``
    gets one line before each cell."""
    kind = kind or detect_device()
    names = list(families or SMOKE_BUILDS)
    unknown = [n for n in names if n not in SMOKE_BUILDS]
    if unknown:
        raise ValueError(f"unknown families {unknown}: choose from {sorted(SMOKE_BUILDS)}")
    cells = []
    with tempfile.TemporaryDirectory(prefix="laptrain-smoke-") as tmp:
        for name in names:
            for precision in precisions or PRECISIONS_BY_DEVICE[kind]:
                if progress is not None:
                    progress(f"{name} / {precision} ...")
                workdir = Path(tmp) / f"{name}-{precision}"
                cells.append(run_cell(SMOKE_BUILDS[name], precision, kind, steps, workdir))
    return cells


def markdown_table(cells: Sequence[Cell]) -> str:
    """Families as rows, precisions as columns; ``|`` in messages escaped."""
    families = list(dict.fromkeys(c.family for c in cells))
    precisions = list(dict.fromkeys(c.precision for c in cells))
    index = {(c.family, c.precision): c for c in cells}
    lines = [
        "| family | " + " | ".join(precisions) + " |",
        "|---" * (len(precisions) + 1) + "|",
    ]
    for fam in families:
        row = [
            index[(fam, p)].text().replace("|", "\\|") if (fam, p) in index else ""
            for p in precisions
        ]
        lines.append(f"| {fam} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def legend_lines(families: Iterable[str], kind: str, steps: int) -> list[str]:
    """What each cell runs, under the table: the fit, the callbacks, and each family's note."""
    guards = ", ".join(name.replace("_", " ") for name in GUARDS)
    lines = [
        f"each cell: fit {steps} step(s), save, resume in a fresh Trainer for {steps} more, "
        f"predict; with EMA, RNG state, the guards {guards} (on, every step: device memory "
        "reads, synchronize, cache release) and the placement check",
    ]
    for name in families:
        family = SMOKE_BUILDS[name]
        if family.note is not None:
            lines.append(f"{name}: {family.note(kind)}")
    return lines
