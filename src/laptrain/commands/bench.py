"""``laptrain bench [overrides...]``: time N training steps of the job ``train.py`` would run
(docs/cli.md).

Built as ``train.py`` builds it, in a temporary folder, without validation; Lightning's profilers
give no samples/s, data-wait share or advice. ``--compare key=a,b`` alternates the two settings
(A B A B ...) so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laptrain.exit_codes import error_exit_code
from laptrain.hardware.peak_rss import process_peak_bytes
from laptrain.project import conf_dir

# Advice thresholds (shares of a step or of a resource); see bench.advice().
DATA_BOUND_SHARE = 0.2  # more than this share of a step waiting for the next batch
MEMORY_BOUND_SHARE = 0.85  # peak memory above this share of the device (or of RAM on CPU)
CPU_UNDERUSED_SHARE = 0.6  # CPU time below this share of the cores torch may use
PADDING_BOUND_SHARE = 0.25  # more than this share of computed tokens are padding
# The key that switches gradient checkpointing on, by preset: the transformers families'
# model.gradient_checkpointing (laptrain.model.gradient_checkpointing), TRM's model.grad_checkpoint (which
# refuses the other name); the memory advice names the one the job's model has.
CHECKPOINTING_KEYS = ("gradient_checkpointing", "grad_checkpoint")


@dataclass
class BenchJob:
    """A composed and built job: what :func:`measure` runs."""

    cfg: Any
    datamodule: Any
    model: Any
    plan: Any
    folder: Path
    env: Any = None


@dataclass
class StepStats:
    """What a bench run measured, per timed step (warm-up steps excluded)."""

    step_s: list[float] = field(default_factory=list)
    data_s: list[float] = field(default_factory=list)
    samples: int = 0
    real_tokens: int = 0
    computed_tokens: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    threads: int = 1
    device: str = "cpu"
    device_peak_bytes: int | None = None
    device_total_bytes: int | None = None
    rss_peak_bytes: int = 0
    ram_total_bytes: int = 0
    workers: int = 0
    grouped: bool | None = None
    checkpointing: str | None = "model.gradient_checkpointing"  # the model's key (None: none)

    @property
    def samples_per_s(self) -> float:
        return self.samples / max(sum(self.step_s), 1e-9)

    @property
    def tokens_per_s(self) -> float:
        return self.real_tokens / max(sum(self.step_s), 1e-9)

    @property
    def data_share(self) -> float:
        return sum(self.data_s) / max(sum(self.step_s), 1e-9)

    @property
    def padding_share(self) -> float:
        return 1 - self.real_tokens / self.computed_tokens if self.computed_tokens else 0.0

    @property
    def cpu_share(self) -> float:
        """CPU time of this process over wall time x the threads torch may use (0..~1)."""
        return self.cpu_s / max(self.wall_s * self.threads, 1e-9)

    def add_step(
        self, step_s: float, data_s: float, samples: int, real: int, computed: int
    ) -> None:
        """Count one timed step: ``step_s`` long, ``data_s`` of it waiting for its batch."""
        self.step_s.append(step_s)
        self.data_s.append(data_s)
        self.samples += samples
        self.real_tokens += real
        self.computed_tokens += computed

    def percentile(self, q: float) -> float:
        times = sorted(self.step_s)
        return times[min(len(times) - 1, int(q * len(times)))] if times else 0.0


def _batch_tokens(batch: Any) -> tuple[int, int]:
    """(real, computed) tokens of a tokenized batch; (0, 0) when it has no token ids. Real tokens
    are counted as the run report counts them (a packed batch's 4-D mask sums to -inf)."""
    from laptrain.callbacks.report_writer import token_count

    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    real = token_count(batch)
    if real is None or not hasattr(ids, "numel"):
        return 0, 0
    return int(real), ids.numel()


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _make_clock_class() -> type:
    import lightning.pytorch as pl

    from laptrain.data.collate import batch_length

    class StepClock(pl.Callback):
        """Times each batch from one ``on_train_batch_start`` to the next, and the time between a
        batch's last hook and the next batch (loading and the loop's logging); synchronises the
        device once per batch so that queued kernels count in their own step."""

        def __init__(self, warmup: int, sync: Callable[[], None]) -> None:
            self.warmup, self.sync = warmup, sync
            self.stats = StepStats()
            self._start: float | None = None
            self._end: float | None = None
            self._pending: tuple[int, int, int] | None = None
            self._cpu0 = 0.0
            self._wall0 = 0.0

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
            now = time.perf_counter()
            if self._start is not None and self._pending is not None:
                self.stats.add_step(now - self._start, now - (self._end or now), *self._pending)
            self._pending = None
            if trainer.global_step == self.warmup:
                self._cpu0, self._wall0 = _cpu_seconds(), now
            if trainer.global_step >= self.warmup:
                self._start = now
                self._pending = (batch_length(batch), *_batch_tokens(batch))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            self.sync()
            self._end = time.perf_counter()

        def on_train_end(self, trainer: Any, pl_module: Any) -> None:
            if self._start is not None and self._pending is not None and self._end:
                self.stats.add_step(self._end - self._start, 0.0, *self._pending)
                self._pending = None
            self.stats.wall_s += (self._end or time.perf_counter()) - self._wall0
            self.stats.cpu_s += _cpu_seconds() - self._cpu0

    return StepClock


def compose_job(
    overrides: Sequence[str], folder: Path, say: Callable[[str], None] = print
) -> tuple[Any, Any]:
    """The config ``python train.py <overrides>`` would run, checked as train.py checks it, with
    its output paths in ``folder``, and the environment report of the profile's variables.
    Raises ValueError/OSError on bad input (one line)."""
    from omegaconf import open_dict

    from laptrain.launch.prepare import compose_checked, resolve_argv
    from laptrain.run_folder.naming import register_resolvers

    register_resolvers()
    argv = resolve_argv(["laptrain-bench", *overrides], conf_dir(), say)
    cfg, env = compose_checked(argv, conf_dir(), say=say)
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
        cfg.paths.ckpt_dir = str(folder / "checkpoints")
    return cfg, env


def build_job(
    overrides: Sequence[str], folder: Path, say: Callable[[str], None] = print
) -> BenchJob:
    """Compose and build (data, model, plan) the job, as ``laptrain.job.run.build`` does for a run."""
    import lightning.pytorch as pl
    import torch

    from laptrain.job.run import build

    cfg, env = compose_job(overrides, folder, say)
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    if cfg.hardware.get("torch_threads"):
        torch.set_num_threads(int(cfg.hardware.torch_threads))
    built = build(cfg, None, folder)  # the device is decided there
    return BenchJob(cfg, built.datamodule, built.model, built.plan, folder, env)


def job_callbacks(job: BenchJob) -> list[Any]:
    """The job's own callbacks (conf/callbacks), those a run of its model builds."""
    from laptrain.callbacks.acting import build_callbacks

    return list(build_callbacks(job.cfg.get("callbacks"), job.model).values())


def make_trainer(
    job: BenchJob, steps: int, callbacks: list[Any], epochs: int = -1, **kwargs: Any
) -> Any:
    """A Trainer for ``steps`` optimizer steps (or ``epochs`` epochs with ``steps=-1``) of the job:
    its config, plan and loggers (writing into the job's folder), no validation, no summary;
    ``kwargs`` are more Trainer arguments."""
    from laptrain.job.run import _instantiate_all, instantiate_trainer

    loggers = _instantiate_all(job.cfg.get("logger"))  # paths point into the temporary folder
    return instantiate_trainer(
        job.cfg,
        job.plan,
        job.model,
        callbacks,
        loggers,
        max_steps=steps,
        max_epochs=epochs,
        limit_val_batches=0,
        enable_model_summary=False,
        default_root_dir=str(job.folder),
        **kwargs,
    )


def _device_sync_and_memory(device: str) -> tuple[Callable[[], None], Callable[[], tuple]]:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        total = torch.cuda.get_device_properties(0).total_memory
        return torch.cuda.synchronize, lambda: (torch.cuda.max_memory_allocated(), total)
    if device == "mps":
        total = torch.mps.recommended_max_memory()
        return torch.mps.synchronize, lambda: (torch.mps.driver_allocated_memory(), total)
    return (lambda: None), (lambda: (None, None))


def measure(job: BenchJob, steps: int, warmup: int = 3, with_callbacks: bool = True) -> StepStats:
    """Run ``warmup + steps`` optimizer steps of the job and return what was measured."""
    import psutil
    import torch

    clock = _make_clock_class()
    sync, memory = _device_sync_and_memory(job.plan.device)
    timer = clock(warmup, sync)
    callbacks = job_callbacks(job) if with_callbacks else []
    # last: its batch-end time is taken after the other callbacks' batch-end hooks
    trainer = make_trainer(job, warmup + steps, [*callbacks, timer])
    trainer.fit(job.model, datamodule=job.datamodule)
    stats = timer.stats
    stats.threads = torch.get_num_threads()
    stats.device = job.plan.device
    stats.device_peak_bytes, stats.device_total_bytes = memory()
    stats.rss_peak_bytes = process_peak_bytes()
    stats.ram_total_bytes = psutil.virtual_memory().total
    stats.workers = int(job.plan.workers or 0)
    stats.grouped = getattr(job.datamodule, "group_by_length", None)
    stats.checkpointing = checkpointing_key(job.cfg.model)
    return stats


def checkpointing_key(model_cfg: Mapping[str, Any]) -> str | None:
    """``model.<key>`` that turns gradient checkpointing on in this config; None for a user's
    module."""
    return next((f"model.{key}" for key in CHECKPOINTING_KEYS if key in model_cfg), None)


def advice(stats: StepStats) -> list[str]:
    """One line per bottleneck found, naming the setting to change; empty when none stands out."""
    lines = []
    if stats.data_share > DATA_BOUND_SHARE:
        if stats.workers == 0:
            lines.append(
                f"data-bound: {stats.data_share:.0%} of each step is spent between batches; "
                "try hardware.num_workers=2 (compare: --compare hardware.num_workers=0,2)"
            )
        else:
            lines.append(
                f"data-bound: {stats.data_share:.0%} of each step is spent between batches with "
                f"{stats.workers} workers; set hardware.persistent_workers=true, more workers, or "
                "pre-tokenize the data once (the tokenized cache under paths.cache_dir)"
            )
    peak, total = stats.device_peak_bytes, stats.device_total_bytes
    if peak is None:
        peak, total = stats.rss_peak_bytes, stats.ram_total_bytes
    if total and peak / total > MEMORY_BOUND_SHARE:
        checkpointing = f" or set {stats.checkpointing}=true" if stats.checkpointing else ""
        lines.append(
            f"memory-bound: peak {peak / 2**30:.1f} GiB of {total / 2**30:.1f} GiB; lower "
            f"hardware.batch_size (accumulation keeps the effective batch){checkpointing}"
        )
    if stats.device == "cpu" and stats.cpu_share < CPU_UNDERUSED_SHARE:
        cores = os.cpu_count() or stats.threads
        load = os.getloadavg()[0]
        hint = (
            f"the machine is busy (load {load:.1f} on {cores} cores): other processes hold "
            "the cores; rerun when it is quiet"
            if load > cores
            else f"raise hardware.torch_threads (this machine has {cores} hardware threads)"
            if stats.threads < cores
            else "the steps may be too small to keep the threads busy: raise hardware.batch_size"
        )
        lines.append(
            f"CPU underused: {stats.cpu_share:.0%} of {stats.threads} torch threads busy; {hint}"
        )
    if stats.padding_share > PADDING_BOUND_SHARE:
        fix = (
            "set data.group_by_length=true"
            if stats.grouped is False
            else "lower data.max_length or the batch size (batches are already grouped by length)"
        )
        lines.append(
            f"padding-bound: {stats.padding_share:.0%} of computed tokens are padding; {fix}"
        )
    return lines


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


def report_lines(stats: StepStats, title: str = "") -> list[str]:
    steps = len(stats.step_s)
    lines = [
        f"laptrain bench{': ' + title if title else ''} ({steps} timed steps, {stats.device}, "
        f"load {os.getloadavg()[0]:.1f})",
        f"  samples/s:         {stats.samples_per_s:.1f}",
        f"  tokens/s:          {stats.tokens_per_s:.0f} real"
        + (f" ({1 - stats.padding_share:.0%} of computed)" if stats.computed_tokens else ""),
        f"  step time:         p50 {stats.percentile(0.5) * 1e3:.1f} ms, "
        f"p90 {stats.percentile(0.9) * 1e3:.1f} ms",
        f"  between batches:   {stats.data_share:.0%} of the step: data loading "
        f"({stats.workers} workers) and logging",
        f"  peak memory:       device {_gib(stats.device_peak_bytes)}, "
        f"RSS {_gib(stats.rss_peak_bytes)} of {_gib(stats.ram_total_bytes)} RAM",
        f"  CPU utilisation:   {stats.cpu_share:.0%} of {stats.threads} torch threads "
        f"({stats.cpu_s / max(stats.wall_s, 1e-9):.1f} cores busy)",
    ]
    found = advice(stats)
    lines.append("advice:" if found else "advice: no bottleneck found")
    lines += [f"  - {line}" for line in found]
    return lines


def parse_compare(text: str) -> tuple[str, list[str]]:
    """``key=a,b`` -> (key, [a, b]); ValueError naming the expected form otherwise."""
    key, _, values = text.partition("=")
    choices = [v for v in values.split(",") if v]
    if not key or len(choices) != 2:
        raise ValueError(f"--compare {text!r}: expected key=a,b (e.g. hardware.num_workers=0,2)")
    return key, choices


def compare(
    overrides: Sequence[str],
    key: str,
    choices: list[str],
    steps: int,
    rounds: int,
    root: Path,
    warmup: int = 3,
) -> tuple[StepStats, StepStats]:
    """Both settings built once, then measured in alternating rounds (A B A B ...)."""
    jobs = [
        build_job([*overrides, f"{key}={c}"], root / f"job{i}", lambda _: None)
        for i, c in enumerate(choices)
    ]
    merged = [StepStats(), StepStats()]
    per_round = max(2, steps // rounds)
    for _ in range(rounds):
        for job, total in zip(jobs, merged):
            _merge(total, measure(job, per_round, warmup))
    return merged[0], merged[1]


def _merge(total: StepStats, part: StepStats) -> None:
    total.step_s += part.step_s
    total.data_s += part.data_s
    for name in ("samples", "real_tokens", "computed_tokens", "wall_s", "cpu_s"):
        setattr(total, name, getattr(total, name) + getattr(part, name))
    for name in ("threads", "device", "device_total_bytes", "ram_total_bytes", "workers"):
        setattr(total, name, getattr(part, name))
    total.grouped, total.checkpointing = part.grouped, part.checkpointing
    total.rss_peak_bytes = max(total.rss_peak_bytes, part.rss_peak_bytes)
    peaks = [p for p in (total.device_peak_bytes, part.device_peak_bytes) if p is not None]
    total.device_peak_bytes = max(peaks) if peaks else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``laptrain bench``'s arguments (laptrain.commands.cli declares the subcommand with them)."""
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    parser.add_argument(
        "--compare",
        metavar="KEY=A,B",
        help="run two settings interleaved and print the ratio (default: time the job as it is)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of A B with --compare")
    parser.add_argument(
        "overrides",
        nargs="*",
        help="train.py overrides, key=value or group=option, before, between or after the "
        "options (default: none, conf/train.yaml as it is)",
    )


def bench_command(args: argparse.Namespace) -> int:
    """Run ``laptrain bench`` with parsed arguments; 2 after a one-line error on bad input."""
    from laptrain.console import quiet_libraries

    quiet_libraries()  # Lightning's tips and known warnings, as a run holds them back
    loggers = [logging.getLogger(n) for n in ("lightning.pytorch", "lightning.fabric", "lightning")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:  # Lightning's info lines would hide the report; restored on return
        lg.setLevel(logging.WARNING)
    try:
        return _bench(args)
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _bench(args: argparse.Namespace) -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="laptrain-bench-") as tmp:
            if args.compare:
                key, choices = parse_compare(args.compare)
                a, b = compare(
                    args.overrides, key, choices, args.steps, args.rounds, Path(tmp), args.warmup
                )
                for stats, choice in ((a, choices[0]), (b, choices[1])):
                    print("\n".join(report_lines(stats, f"{key}={choice}")))
                print(
                    f"{key}={choices[1]} vs {key}={choices[0]}: samples/s ratio "
                    f"{b.samples_per_s / max(a.samples_per_s, 1e-9):.2f}, step p50 ratio "
                    f"{b.percentile(0.5) / max(a.percentile(0.5), 1e-9):.2f} "
                    f"({args.rounds} interleaved rounds)"
                )
                return 0
            job = build_job(args.overrides, Path(tmp))
            stats = measure(job, args.steps, args.warmup)
            print("\n".join(report_lines(stats)))
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return error_exit_code(err)  # 2, or the preflight found the job does not fit
    except RuntimeError as err:
        from laptrain.callbacks.oom_backoff import is_oom

        if not is_oom(err):
            raise
        from laptrain.exit_codes import DOES_NOT_FIT_EXIT

        print(f"error: out of memory: {str(err).splitlines()[0][:300]}", file=sys.stderr)
        return DOES_NOT_FIT_EXIT
    return 0
