"""``laptrain why <run>``: what happened in a run and what to change, read from the run's own
records.

The records (any one is enough): the TensorBoard event files (tensorboard's ``EventAccumulator``)
or ``csv/metrics.csv``, ``report.json``, and ``run_info.json`` / ``.hydra/config.yaml``. Lightning
logs ``train/*``, ``val/*`` and ``lr-*`` at ``trainer.global_step - 1``, the guards and the report
at ``global_step``. :func:`diagnose` is a pure function of the series and the report; each rule
gives at most one :class:`Finding` (the rules and thresholds: docs/cli.md, ``laptrain why``).
"""

from __future__ import annotations

import contextlib
import csv
import logging
import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laptrain.family import family_of
from laptrain.hardware.power import PRESSURE_WARNING, pressure_name
from laptrain.hardware.thermal import LEVEL_NAMES
from laptrain.ranks.processes import shards_model_state
from laptrain.run_folder.listing import json_record, section

Points = list[tuple[int, float]]
Series = dict[str, Points]

EMA_POINTS = 10
DIVERGENCE_RISE = 0.20
DIVERGENCE_STAY = 3
DIVERGENCE_POINTS = 10
OVERFIT_EVALS = 3
OVERFIT_RISE = 0.02
PLATEAU_EVALS = 4
PLATEAU_RELATIVE = 0.01
THROUGHPUT_FALL = 0.80
THROUGHPUT_POINTS = 8
MAX_LINES = 8  # the header and up to 7 findings

# RunReport's status after an exception is f"interrupted ({type(exception).__name__})"; the NaN
# guard raises laptrain.callbacks.nonfinite_guard.NonFiniteLoss (named here: no torch import)
NONFINITE_STOP = "NonFiniteLoss"
# report.json plot-point fields and the TensorBoard tags the same callbacks log them under
HISTORY_TAGS = {
    "loss": "train/loss",
    "thermal_state": "thermal/state",
    "drift_pct": "thermal/drift_pct",
    "rss_mb": "memory/rss_mb",
}
CLIP = "trainer.gradient_clip_val=1.0"
# Lightning refuses to clip the gradients of an optimizer that unscales them itself (a fused
# Adam/AdamW) under 16-mixed (lightning/pytorch/plugins/precision/amp.py, clip_gradients)
CLIP_UNFUSED = f"model.optimizer.fused=false {CLIP}"
THROUGHPUT_TAGS = ("train/samples_per_s", "samples_per_s", "train/tokens_per_s", "tokens_per_s")
# below this, a swap or system-memory change over the slow stretch is not named
SWAP_GROWTH_MB = 100.0
SYSTEM_PERCENT_GROWTH = 5.0


@dataclass(frozen=True)
class Finding:
    """One claim about the run: what (``kind``), where (``step``, ``value``: the value the rule
    rests on), what to change."""

    kind: str  # nonfinite, oom, divergence, overfitting, plateau, throughput, ok, a family's
    step: int | None
    value: float | None
    text: str
    advice: str

    def line(self) -> str:
        return f"{self.text}: {self.advice}" if self.advice else self.text


@dataclass
class RunRecords:
    """What ``laptrain why`` reads from a run folder."""

    folder: Path
    series: Series
    report: dict[str, Any] | None
    precision: str | None = None
    monitor: str | None = None
    clip: str | None = CLIP  # the overrides that clip this run's gradients; None: none can
    checkpoints: dict[int, str] = field(default_factory=dict)  # best-step<N>.ckpt by N
    family_rules: Callable[[Series], list[Finding]] | None = None  # its family's ``why``


def number_text(value: float | None) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return str(value)
    if abs(value) >= 1e6 or 0 < abs(value) < 1e-3:
        return f"{value:.3g}"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _lr(value: float) -> str:
    """A learning rate as the NaN guard's own message writes it."""
    return f"{value:.3g}"


def finite_points(points: Points) -> Points:
    return [(s, v) for s, v in points if math.isfinite(v)]


def smoothed(values: list[float], points: int = EMA_POINTS) -> list[float]:
    alpha = 2.0 / (points + 1)
    out: list[float] = []
    for v in values:
        out.append(v if not out else alpha * v + (1 - alpha) * out[-1])
    return out


def _value_at(points: Points, step: int) -> float | None:
    """The last value logged at or before ``step`` (the first one if all are later)."""
    if not points:
        return None
    before = [v for s, v in points if s <= step]
    return before[-1] if before else points[0][1]


def _lr_at(series: Series, report: Mapping[str, Any] | None, step: int) -> float | None:
    tags = sorted(t for t in series if t.startswith("lr-"))
    if tags:
        return _value_at(series[tags[0]], step)
    run = section(report, "run")
    logged = [v for k, v in sorted(run.items()) if k.startswith("lr-") and isinstance(v, float)]
    return logged[0] if logged else None


def _guard_stop(guard: Mapping[str, Any]) -> dict[str, Any] | None:
    """The NaN guard's ``stop`` record, if it has a step and a kind (reports before it have none)."""
    stop = guard.get("stop")
    if not isinstance(stop, dict) or not isinstance(stop.get("step"), int):
        return None
    return stop if stop.get("what") in ("loss", "gradients") else None


def _recorded_lrs(stop: Mapping[str, Any]) -> list[float]:
    """The distinct learning rates the guard recorded, in parameter-group order."""
    lrs = [float(v) for v in stop.get("lr") or [] if isinstance(v, int | float)]
    return list(dict.fromkeys(lrs))


def _stop_fixes(
    stop: Mapping[str, Any], lr: float | None, precision: str | None, clip: str | None
) -> list[str]:
    """The fixes for what the guard saw: large updates for gradients, the data first for the loss
    (and only the data or the initial weights at step 0, before any update used the lr)."""
    lower = [f"model.optimizer.lr={_lr(lr / 10)} (10x lower)"] if lr else []
    fp16 = precision is not None and precision.startswith("16")
    if stop["what"] == "gradients":
        fixes = [clip] if clip else []
        fixes += lower
        fixes += [f"hardware.precision=bf16-mixed instead of {precision}"] if fp16 else []
    elif stop["step"] == 0:
        fixes = ["check the data (a bad row in the first batch: inputs or labels)"]
        fixes.append("check the model's initial weights (no update ran yet: not the lr)")
    else:
        fixes = ["check the data (a bad row in that batch: inputs or labels)", *lower]
        fixes += ["hardware.precision=bf16-mixed or 32-true (16-bit overflow)"] if fp16 else []
    return [*fixes, "callbacks.nonfinite_guard.action=skip"]


def _recorded_stop(
    stop: Mapping[str, Any],
    series: Series,
    report: Mapping[str, Any] | None,
    precision: str | None,
    clip: str | None,
) -> Finding:
    """The finding for a stop the guard recorded: what was not finite, where, with which lr."""
    step, value = int(stop["step"]), str(stop.get("value") or "not finite")
    if stop["what"] == "gradients":
        name = stop.get("parameter")
        seen = f"the gradient of {name} was {value}" if name else "the gradient norm was inf"
    else:
        seen = f"the loss was {value}"
    logged = _lr_at(series, report, step)
    lrs = _recorded_lrs(stop) or ([] if logged is None else [logged])
    lr = lrs[0] if lrs else None
    facts = f"lr {' / '.join(_lr(v) for v in lrs)}" if lrs else "lr not recorded"
    precision = str(stop.get("precision") or precision or "not recorded")
    return Finding(
        "nonfinite",
        step,
        lr,
        f"the NaN guard stopped the run at step {step}: {seen} ({facts}, precision {precision})",
        "fixes: " + ", ".join(_stop_fixes(stop, lr, precision, clip)),
    )


def nonfinite(
    series: Series,
    report: Mapping[str, Any] | None,
    precision: str | None,
    clip: str | None = CLIP,
) -> Finding | None:
    run, guard = section(report, "run"), section(report, "nonfinite")
    stop = _guard_stop(guard)
    if stop is not None:
        return _recorded_stop(stop, series, report, precision, clip)
    skipped = [s for s in guard.get("skipped") or [] if isinstance(s, dict) and "step" in s]
    value: float | None = None
    facts: list[str] = []
    if NONFINITE_STOP in str(run.get("status", "")) and run.get("global_step") is not None:
        step = int(run["global_step"])
        what = f"a NaN/inf loss or gradient stopped the run at step {step}"
    elif skipped:
        step = int(skipped[0]["step"])
        what = f"{len(skipped)} non-finite step(s) skipped, the first at step {step}"
        facts.append(str(skipped[0].get("why", "not finite")))
    else:
        bad = [(s, v) for s, v in series.get("train/loss", []) if not math.isfinite(v)]
        if not bad:
            return None
        step, value = bad[0]
        what = f"train/loss is {value} at step {step}"
        facts.append("no NaN guard record")
    lr = _lr_at(series, report, step)
    facts.append(f"lr {_lr(lr)}" if lr is not None else "lr not recorded")
    facts.append(f"precision {precision or 'not recorded'}")
    fixes = [f"model.optimizer.lr={_lr(lr / 10)} (10x lower)"] if lr else []
    fixes += [clip] if clip else []
    if precision and precision.startswith("16"):
        fixes.append("hardware.precision=bf16-mixed or 32-true (16-bit overflow)")
    fixes.append("a bad row in that batch")
    if not skipped and guard.get("action") != "skip":
        fixes.append("callbacks.nonfinite_guard.action=skip")
    return Finding(
        "nonfinite",
        step,
        lr if value is None else value,
        f"{what} ({', '.join(facts)})",
        "usual fixes: " + ", ".join(fixes),
    )


def oom_backoff(series: Series, report: Mapping[str, Any] | None) -> Finding | None:
    events = [
        (int(e["step"]), int(e["from"]), int(e["to"]))
        for e in section(report, "oom").get("events") or []
        if isinstance(e, dict) and {"step", "from", "to"} <= e.keys()
    ]
    if not events:  # no report (a killed run): the logged micro-batch
        points = finite_points(series.get("oom/micro_batch", []))
        events = [
            (s, int(prev), int(v)) for (_, prev), (s, v) in zip(points, points[1:]) if v < prev
        ]
    if not events:
        return None
    step, first, _ = events[0]
    last = events[-1][2]
    if len(events) == 1:
        text = f"out of memory at step {step} with micro-batch {first}: continued at {last}"
    else:
        chain = ", ".join(f"{a} -> {b} at step {s}" for s, a, b in events)
        text = f"out of memory {len(events)} times, micro-batch {chain}"
    ratio = first // max(last, 1)
    return Finding(
        "oom",
        step,
        float(last),
        f"{text} (same effective batch)",
        f"start there: hardware.batch_size={last} with trainer.accumulate_grad_batches x{ratio} "
        "keeps the effective batch; or model.gradient_checkpointing=true, a shorter "
        "data.max_length",
    )


def divergence(
    series: Series, report: Mapping[str, Any] | None, clip: str | None = CLIP
) -> Finding | None:
    points = finite_points(series.get("train/loss", []))
    if len(points) < DIVERGENCE_POINTS:
        return None
    steps, ema = [s for s, _ in points], smoothed([v for _, v in points])
    low = min(range(len(ema)), key=ema.__getitem__)
    line = ema[low] + DIVERGENCE_RISE * abs(ema[low])
    below = [i for i in range(low, len(ema)) if ema[i] <= line]
    start = below[-1] + 1
    if len(ema) - start < DIVERGENCE_STAY:
        return None
    rise = (ema[-1] - ema[low]) / abs(ema[low]) if ema[low] else math.inf
    lr = _lr_at(series, report, steps[start])
    try_lr = f" (it was {_lr(lr)} at step {steps[start]}: try {_lr(lr / 3)})" if lr else ""
    return Finding(
        "divergence",
        steps[low],
        ema[low],
        f"train/loss rising after step {steps[low]}: smoothed {number_text(ema[low])} there, "
        f"{number_text(ema[-1])} at step {steps[-1]} ({rise:+.0%}), over +{DIVERGENCE_RISE:.0%} "
        f"since step {steps[start]}",
        f"lower model.optimizer.lr{try_lr}" + (f" or set {clip}" if clip else ""),
    )


def overfitting(series: Series, checkpoints: Mapping[int, str]) -> Finding | None:
    val = finite_points(series.get("val/loss", []))
    train = finite_points(series.get("train/loss", []))
    if len(val) <= OVERFIT_EVALS or len(train) < 2:
        return None
    values = [v for _, v in val]
    best = max(i for i, v in enumerate(values) if v == min(values))  # the last of equal minima
    after = len(values) - 1 - best
    if after < OVERFIT_EVALS or values[-1] < values[best] + OVERFIT_RISE * abs(values[best]):
        return None
    step = val[best][0]
    ema = smoothed([v for _, v in train])
    at_best = _value_at(list(zip([s for s, _ in train], ema)), step)
    if at_best is None or ema[-1] >= at_best:
        return None
    kept = checkpoints.get(step) or checkpoints.get(step + 1)  # checkpoints name global_step
    keep = f"keep {kept}" if kept else f"the weights of step {step} are the best"
    return Finding(
        "overfitting",
        step,
        values[best],
        f"overfitting: val/loss rising after step {step}: {number_text(values[best])} there, "
        f"{number_text(values[-1])} at "
        f"step {val[-1][0]} over {after} evaluations, while train/loss (smoothed) fell "
        f"{number_text(at_best)} -> {number_text(ema[-1])}",
        f"{keep}; stop near step {step} next time, or regularize (more data, "
        "dropout, model.optimizer.weight_decay)",
    )


def plateau(series: Series, monitor: str | None) -> Finding | None:
    name = monitor if monitor in series else "val/loss"
    evals = finite_points(series.get(name, []))
    if len(evals) < PLATEAU_EVALS:
        return None

    def flat(window: Points) -> bool:
        values = [v for _, v in window]
        spread = max(values) - min(values)
        return spread == 0 or spread < PLATEAU_RELATIVE * abs(statistics.fmean(values))

    n = PLATEAU_EVALS
    if not flat(evals[-n:]):
        return None
    while n < len(evals) and flat(evals[-n - 1 :]):
        n += 1
    window = evals[-n:]
    values = [v for _, v in window]
    mean, half = statistics.fmean(values), (max(values) - min(values)) / 2
    first, last = window[0][0], window[-1][0]
    if n == len(evals):
        advice = (
            "the model is not learning; raise model.optimizer.lr (x3-10), check the labels, "
            "or train longer"
        )
    else:
        advice = (
            f"no gain since step {first}: stop earlier (trainer.max_steps / max_epochs), or "
            "raise model.optimizer.lr or use a bigger model to go further"
        )
    return Finding(
        "plateau",
        first,
        mean,
        f"{name} flat at {number_text(mean)} ± {half:.1g} over the last {n} evaluations "
        f"(steps {first}-{last})",
        advice,
    )


def _throughput_series(series: Series) -> tuple[str, Points] | None:
    names = [*THROUGHPUT_TAGS]
    names += sorted(t for t in series if t.endswith(("samples_per_s", "tokens_per_s")))
    for name in names:
        points = [(s, v) for s, v in finite_points(series.get(name, [])) if v > 0]
        if len(points) >= THROUGHPUT_POINTS:
            return name, points
    return None


def _in(points: Points, lo: int, hi: int) -> list[float]:
    return [v for s, v in finite_points(points) if lo <= s <= hi]


SLOW_ADVICE = {
    "thermal": "the machine throttled: let it cool (hard, open surface; charger in), or "
    "lower hardware.batch_size; callbacks.thermal_guard paces it",
    "memory": "memory ran short: close other applications, or lower hardware.batch_size / "
    "data.max_length",
    "oom": "smaller micro-batches are slower: start at the size that fits (see above)",
    "": "nothing recorded explains it: look for other processes sharing the machine",
}


def _slow_context(
    series: Series, report: Mapping[str, Any] | None, early: tuple[int, int], late: tuple[int, int]
) -> tuple[list[str], str]:
    """What the guards recorded over the slow stretch (against the fast one); the advice."""
    said, why = [], ""
    state = _in(series.get("thermal/state", []), *late)
    if state and max(state) >= 1:
        level = int(max(state))
        said.append(f"thermal state {LEVEL_NAMES[min(level, 3)]}")
        why = why or ("thermal" if level >= 2 else "")
    drift = _in(series.get("thermal/drift_pct", []), *late)
    if drift and max(drift) > 0:
        said.append(f"step time +{max(drift):.0f} % over the baseline")
    breaks = [
        e
        for e in section(report, "thermal").get("events") or []
        if isinstance(e, dict) and late[0] <= e.get("step", -1) <= late[1]
    ]
    if breaks:
        seconds = sum(float(e.get("s", 0)) for e in breaks)
        said.append(f"{len(breaks)} cooling break(s), {seconds:.0f} s")
        why = why or "thermal"
    memory = _memory_signs(series, early, late)
    said += memory
    why = why or ("memory" if memory else "")
    halved = [
        e
        for e in section(report, "oom").get("events") or []
        if isinstance(e, dict) and early[0] <= e.get("step", -1) <= late[1]
    ]
    if halved:
        said.append(f"micro-batch halved at step {halved[0]['step']} (OOM backoff)")
        why = why or "oom"
    if not said:
        recorded = any(t.startswith(("thermal/", "memory/")) for t in series)
        said.append(
            "thermal state, memory and swap unchanged"
            if recorded
            else "no thermal or memory record (the guards were off)"
        )
    return said, SLOW_ADVICE[why]


def _memory_signs(series: Series, early: tuple[int, int], late: tuple[int, int]) -> list[str]:
    """Swap, system memory and memory pressure that grew from the fast stretch to the slow one."""
    said = []
    swap_early = _in(series.get("memory/swap_used_mb", []), *early)
    swap_late = _in(series.get("memory/swap_used_mb", []), *late)
    if swap_early and swap_late and max(swap_late) - min(swap_early) >= SWAP_GROWTH_MB:
        said.append(f"swap {number_text(max(swap_late))} MB (was {number_text(min(swap_early))})")
    system_early = _in(series.get("memory/system_percent", []), *early)
    system_late = _in(series.get("memory/system_percent", []), *late)
    if (
        system_early
        and system_late
        and max(system_late) - statistics.median(system_early) >= SYSTEM_PERCENT_GROWTH
    ):
        said.append(
            f"system memory {max(system_late):.0f} % (was {statistics.median(system_early):.0f} %)"
        )
    pressure = _in(series.get("memory/pressure_level", []), *late)
    if pressure and max(pressure) >= PRESSURE_WARNING:
        said.append(f"memory pressure {pressure_name(int(max(pressure)))}")
    return said


def throughput(series: Series, report: Mapping[str, Any] | None) -> Finding | None:
    found = _throughput_series(series)
    if found is None:
        return None
    name, points = found
    half, quarter = points[: len(points) // 2], points[-(len(points) // 4) :]
    fast = statistics.median(v for _, v in half)
    slow = statistics.median(v for _, v in quarter)
    if slow >= THROUGHPUT_FALL * fast:
        return None
    unit = "tokens/s" if "tokens" in name else "samples/s"
    early, late = (half[0][0], half[-1][0]), (quarter[0][0], quarter[-1][0])
    said, advice = _slow_context(series, report, early, late)
    return Finding(
        "throughput",
        late[0],
        slow,
        f"{unit} fell from {number_text(fast)} (median, steps {early[0]}-{early[1]}) to "
        f"{number_text(slow)} "
        f"(steps {late[0]}-{late[1]}, {slow / fast - 1:+.0%}); then: {', '.join(said)}",
        advice,
    )


def _final_metrics(series: Series, report: Mapping[str, Any] | None, monitor: str | None) -> str:
    metrics = {
        k: float(v)
        for k, v in section(report, "metrics").items()
        if isinstance(v, int | float) and k.startswith(("val/", "test/", "train/loss"))
    }
    if not metrics:
        metrics = {
            k: pts[-1][1]
            for k, pts in series.items()
            if pts and k.startswith(("val/", "test/", "train/loss"))
        }
    order = sorted(metrics, key=lambda k: (k != monitor, not k.startswith("val/"), k))
    return " · ".join(f"{k} {number_text(metrics[k])}" for k in order[:5]) or "no metrics recorded"


def diagnose(
    series: Series,
    report: Mapping[str, Any] | None = None,
    *,
    precision: str | None = None,
    monitor: str | None = None,
    checkpoints: Mapping[int, str] | None = None,
    clip: str | None = CLIP,
    family_rules: Callable[[Series], list[Finding]] | None = None,
) -> list[Finding]:
    """The findings of every rule (docs/cli.md), most pressing first; "ok" when none fires;
    ``checkpoints``: the run's ``best-step<N>.ckpt`` by N."""
    hardware, ckpt = section(report, "hardware"), section(report, "checkpoint")
    precision = hardware.get("precision") or precision
    monitor = ckpt.get("monitor") or monitor
    found = [
        nonfinite(series, report, precision, clip),
        oom_backoff(series, report),
        divergence(series, report, clip),
        overfitting(series, checkpoints or {}),
        plateau(series, monitor),
        *(family_rules(series) if family_rules else []),
        throughput(series, report),
    ]
    findings = [f for f in found if f is not None]
    if findings:
        return findings
    steps = [pts[-1][0] for pts in series.values() if pts]
    step = section(report, "run").get("global_step") or (max(steps) if steps else None)
    where = f" (step {step})" if step is not None else ""
    return [
        Finding(
            "ok",
            step,
            None,
            f"nothing unusual found{where}",
            f"final {_final_metrics(series, report, monitor)}",
        )
    ]


# ---- reading a run folder ----


def _add(series: Series, name: str, step: int, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        series.setdefault(name, []).append((int(step), float(value)))


def read_event_dir(folder: Path) -> Series:
    """Every scalar of one TensorBoard run's event files, as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    quiet = logging.getLogger("tensorboard")
    level, quiet.level = quiet.level, logging.ERROR  # "out of order step" notes: not the user's
    try:
        acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        acc.Reload()
        tags = acc.Tags()
        series: Series = {}
        for tag in tags.get("scalars", []):
            for event in acc.Scalars(tag):
                _add(series, tag, event.step, event.value)
        for tag in tags.get("tensors", []):  # tf.summary v2 scalars
            for event in acc.Tensors(tag):
                array = tensor_util.make_ndarray(event.tensor_proto)
                if array.size == 1:
                    _add(series, tag, event.step, float(array.reshape(-1)[0]))
    finally:
        quiet.level = level
    return series


def read_csv_metrics(path: Path) -> Series:
    """Lightning's ``CSVLogger`` file: a ``step`` column and one column per metric."""
    series: Series = {}
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            try:
                step = int(float(row.get("step") or ""))
            except ValueError:
                continue
            for name, cell in row.items():
                if name != "step" and cell not in (None, ""):
                    with contextlib.suppress(ValueError):
                        _add(series, name, step, float(cell))
    return series


def _merge(into: Series, more: Series) -> None:
    for name, points in more.items():
        into[name] = sorted([*into.get(name, []), *points], key=lambda p: p[0])


def _from_report(series: Series, report: Mapping[str, Any]) -> None:
    """Plot points and validations of ``report.json`` for the curves the logs lack."""
    extra: Series = {}
    for point in report.get("history") or []:
        if not isinstance(point, dict) or "step" not in point:
            continue
        _add(extra, "samples_per_s", point["step"], point.get("samples_per_s"))
        for key, tag in HISTORY_TAGS.items():
            _add(extra, tag, point["step"], point.get(key))
    for point in report.get("val_history") or []:
        if isinstance(point, dict) and "step" in point:
            for key, value in point.items():
                if key != "step":
                    _add(extra, key, point["step"], value)
    for name, points in extra.items():
        if name not in series:
            series[name] = points


def clip_overrides(config: Mapping[str, Any], precision: str | None) -> str | None:
    """The overrides that let a run like this one (its ``.hydra/config.yaml``) clip its gradients,
    or None where Lightning refuses every form: manual optimization (TRM), FSDP
    (``FSDPPrecision.clip_grad_by_norm``); a fused Adam/AdamW under ``16-mixed`` off MPS needs
    ``fused=false`` too (it unscales in its step: ``clip_gradients``, plugins/precision/amp.py)."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    hardware = config.get("hardware") if isinstance(config.get("hardware"), dict) else {}
    family = family_of(model)  # manual optimization: Lightning refuses trainer.gradient_clip_val
    if family is not None and family.manual_optimization:
        return None
    if shards_model_state(trainer.get("strategy")):
        return None
    optimizer = model.get("optimizer") if isinstance(model.get("optimizer"), dict) else {}
    accelerator = str(trainer.get("accelerator") or "")
    if not accelerator or "${" in accelerator:  # saved unresolved: ${hardware.accelerator}
        accelerator = str(hardware.get("accelerator") or "")
    on_mps = accelerator == "mps"  # the launch builds it unfused there (laptrain.launch.device)
    if precision == "16-mixed" and optimizer.get("fused") is True and not on_mps:
        return CLIP_UNFUSED
    return CLIP


def _config_facts(folder: Path) -> tuple[str | None, str | None, str | None, Any]:
    """(precision, monitored metric, the overrides that clip gradients, the family's ``why``
    rules) from ``run_info.json`` and ``.hydra/config.yaml``."""
    import yaml

    precision = ((json_record(folder / "run_info.json") or {}).get("plan") or {}).get("precision")
    try:
        config = yaml.safe_load((folder / ".hydra" / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        config = None
    config = config if isinstance(config, dict) else {}
    hardware = config.get("hardware") if isinstance(config.get("hardware"), dict) else {}
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    metric = model.get("_metric_") if isinstance(model.get("_metric_"), dict) else {}
    named = metric.get("name") or config.get("optimized_metric")
    # conf/train.yaml: optimized_metric: ${oc.select:model._metric_.name,val/acc}
    selected = re.fullmatch(r"\$\{oc\.select:[\w.]+,([^}]+)\}", str(named))
    named = selected.group(1).strip() if selected else named
    monitor = named if isinstance(named, str) and "${" not in named else None
    configured = hardware.get("precision")
    configured = configured if isinstance(configured, str) and "${" not in configured else None
    precision = precision or configured
    family = family_of(model)
    return precision, monitor, clip_overrides(config, precision), family and family.why


def read_run(folder: str | Path) -> RunRecords:
    """The records of a run folder. Raises ValueError for a missing folder or one with none."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(
            f"no run folder {folder}: give a folder such as outputs/<run> (`laptrain runs` lists them)"
        )
    report = json_record(folder / "report.json")
    series: Series = {}
    logs = folder / "tensorboard"
    files = sorted(logs.rglob("events.out.tfevents.*")) if logs.is_dir() else []
    files = files or sorted(folder.glob("events.out.tfevents.*"))
    for directory in sorted({f.parent for f in files}):
        _merge(series, read_event_dir(directory))
    if not files and (folder / "csv" / "metrics.csv").is_file():
        series = read_csv_metrics(folder / "csv" / "metrics.csv")
    if report is None and not series:
        raise ValueError(
            f"{folder} has no run records (report.json, tensorboard/ event files): give a run "
            "folder such as outputs/<run> (`laptrain runs` lists them)"
        )
    if report:
        _from_report(series, report)
    precision, monitor, clip, rules = _config_facts(folder)
    checkpoints = {}
    for path in (folder / "checkpoints").glob("best-step*.ckpt"):
        number = re.fullmatch(r"best-step(\d+)(-v\d+)?", path.stem)
        if number:
            checkpoints[int(number.group(1))] = f"checkpoints/{path.name}"
    return RunRecords(folder, series, report, precision, monitor, clip, checkpoints, rules)


def _header(records: RunRecords) -> str:
    run = section(records.report, "run")
    if run:
        status = str(run.get("status", "status not recorded"))
        return f"{records.folder}: {status} at step {run.get('global_step', '—')}"
    steps = [pts[-1][0] for pts in records.series.values() if pts]
    last = f"; logged to step {max(steps)}" if steps else ""
    return f"{records.folder}: no report.json (killed before it wrote one?){last}"


def run_findings(records: RunRecords) -> list[Finding]:
    """:func:`diagnose` on everything a run folder's records hold."""
    return diagnose(
        records.series,
        records.report,
        precision=records.precision,
        monitor=records.monitor,
        checkpoints=records.checkpoints,
        clip=records.clip,
        family_rules=records.family_rules,
    )


def why_lines(folder: str | Path, limit: int = MAX_LINES) -> list[str]:
    """What ``laptrain why`` prints: a header, then one line per finding (``limit`` in all)."""
    records = read_run(folder)
    return [_header(records), *(f.line() for f in run_findings(records))][:limit]


def why_json(folder: str | Path, limit: int = MAX_LINES) -> dict[str, Any]:
    """``laptrain why --json``: the run, its status, step and header, and each finding."""
    records = read_run(folder)
    run = section(records.report, "run")
    findings = run_findings(records)[: limit - 1]
    return {
        "run": str(records.folder),
        "status": run.get("status"),
        "step": run.get("global_step"),
        "header": _header(records),
        "findings": [
            {
                "kind": f.kind,
                "step": f.step,
                "value": f.value if f.value is None or math.isfinite(f.value) else str(f.value),
                "text": f.text,
                "advice": f.advice,
                "line": f.line(),
            }
            for f in findings
        ],
    }
