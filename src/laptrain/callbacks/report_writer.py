"""Write a run report (``report.json``, ``report.md``, ``report.png``) from plain dicts, so it is
rebuilt and tested without a Trainer; matplotlib's object API on the Agg canvas (no pyplot)."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import torch
from torch import Tensor

from laptrain.files import write_text_atomic

PLOT_NAME = "report.png"
PLOT_ALT = "loss, validation metrics, throughput, memory and thermal state"
# torch's cross_entropy ignore_index: the prompt and pad positions of a causal-LM batch's labels
IGNORE_LABEL = -100


def token_count(batch: Any) -> int | Tensor | None:
    """Real (non-pad) tokens in a tokenized batch (its 2D or ``[B, 2, L]`` ``attention_mask``; a
    packed batch's from its ``labels``: ``packed_tokens``), else ``input_ids`` size, else None. A
    0-dim tensor on the batch's device: reading it as a number would sync the device every step."""
    if not isinstance(batch, Mapping):
        return None
    mask, labels, ids = (batch.get(k) for k in ("attention_mask", "labels", "input_ids"))
    if isinstance(mask, Tensor) and (
        mask.dim() == 2 or (mask.dim() == 3 and not mask.is_floating_point())
    ):
        return mask.detach().sum()
    if isinstance(mask, Tensor) and isinstance(labels, Tensor) and labels.dim() == 2:
        return packed_tokens(labels)
    return ids.numel() if isinstance(ids, Tensor) else None


def packed_tokens(labels: Tensor) -> Tensor:
    """Non-pad positions of packed rows: each row's last labelled position + 1 (every packed example
    ends with a labelled end-of-turn, so the tail after it is the padding)."""
    labelled = labels.detach() != IGNORE_LABEL
    last = labels.shape[1] - labelled.flip(1).int().argmax(1)
    return torch.where(labelled.any(1), last, 0).sum()


def machine_facts() -> dict[str, Any]:
    """Platform, CPU count and RAM; ``ram_gb`` is GiB (bytes / 2^30, so a 16 GB Mac reads 16.0;
    the key keeps its name for readers of ``report.json``)."""
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": psutil.cpu_count(logical=False) or psutil.cpu_count(),
        "ram_gb": round(psutil.virtual_memory().total / 1024**3, 1),
    }


def write_report(folder: str | os.PathLike[str], report: dict[str, Any], plot: bool = True) -> Path:
    """Write the three files into ``folder`` (``plot=False``: the plot as it is); return the path
    of ``report.json``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if plot:
        plot_history(report.get("history", []), report, folder / PLOT_NAME)
    write_text_atomic(folder / "report.md", render_markdown(report))
    write_text_atomic(folder / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    return folder / "report.json"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    return "—" if value is None else str(value)


def render_markdown(report: dict[str, Any]) -> str:
    """The human-readable report: one table per section, then the plot and the events."""
    run = report["run"]
    lines = [f"# Run report: {run['name']}", "", f"Status: **{run['status']}**", ""]
    ckpt = report.get("checkpoint") or {}
    if ckpt.get("best"):
        score = f" ({ckpt.get('monitor')} {_fmt(ckpt.get('best_score'))})"
        lines += [f"Best checkpoint: `{ckpt['best']}`{score}", ""]
    if ckpt.get("resume"):
        lines += [f"Resume (or rerun) with: `{ckpt['resume']}`", ""]
    # every section in order (a new reporting callback's too); metrics and history follow below
    for section, body in report.items():
        if section in ("metrics", "history", "checkpoint") or not isinstance(body, Mapping):
            continue
        rows = {k: v for k, v in body.items() if not isinstance(v, (list, dict))}
        if not rows:
            continue
        lines += [f"## {section}", "", "| | |", "|---|---|"]
        lines += [f"| {key} | {_fmt(value)} |" for key, value in rows.items()]
        lines.append("")
    metrics = report.get("metrics", {})
    if metrics:
        lines += ["## final metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {_fmt(v)} |" for k, v in sorted(metrics.items())]
        lines.append("")
    lines += [
        "## over steps",
        "",
        f"![{PLOT_ALT}]({PLOT_NAME})",
        "",
    ]
    for title, events in (
        ("cooling breaks", report.get("thermal", {}).get("events", [])),
        ("OOM backoffs", report.get("oom", {}).get("events", [])),
        ("OOM backoff", [s] if (s := report.get("oom", {}).get("not_applied")) else []),
        ("battery pauses and stops", report.get("power", {}).get("events", [])),
        ("NaN guard stop", [s] if (s := report.get("nonfinite", {}).get("stop")) else []),
    ):
        if events:
            lines += [f"## {title}", ""] + [f"- {json.dumps(e)}" for e in events] + [""]
    return "\n".join(lines)


def _panels(history: list[dict[str, Any]], val: list[dict[str, Any]]) -> list[tuple]:
    """(y label, [(points, key, label)]) per panel; memory and thermal only when recorded."""
    val_keys = sorted({k for p in val for k in p if k not in ("step", "val/loss")})
    panels = [
        ("loss", [(history, "loss", "train loss"), (val, "val/loss", "validation loss")]),
        ("validation", [(val, k, k) for k in val_keys]),
        ("samples/s", [(history, "samples_per_s", "samples/s")]),
        ("MB", [(history, "rss_mb", "process RSS"), (history, "device_mb", "device allocated")]),
        (
            "thermal",
            [(history, "thermal_state", "state (0-3)"), (history, "drift_pct", "drift % / 10")],
        ),
    ]
    recorded = [
        (label, series)
        for label, series in panels
        if any(p.get(key) is not None for points, key, _ in series for p in points)
    ]
    return recorded or panels[:1]


def plot_history(history: list[dict[str, Any]], report: dict[str, Any], path: Path) -> None:
    """Train and validation loss, the validation metrics, samples/s, and memory and thermal state
    where they were recorded, over steps, with breaks and backoffs marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels = _panels(history, report.get("val_history") or [])
    fig = Figure(figsize=(9, 1.2 + 2.2 * len(panels)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(panels), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (ylabel, series) in zip(axes, panels):
        for points, key, label in series:
            xs = [p["step"] for p in points if p.get(key) is not None]
            ys = [
                p[key] / (10 if key == "drift_pct" else 1) for p in points if p.get(key) is not None
            ]
            if xs:
                ax.plot(
                    xs,
                    ys,
                    label=label,
                    marker="o" if points is not history or len(xs) < 30 else None,
                )
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(loc="upper right", fontsize="small")
        else:
            ax.text(0.5, 0.5, "not recorded", transform=ax.transAxes, ha="center", va="center")
        for event in report.get("thermal", {}).get("events", []):
            ax.axvline(event["step"], color="tab:blue", linestyle="--", alpha=0.5)
        for event in report.get("oom", {}).get("events", []):
            ax.axvline(event["step"], color="tab:red", linestyle=":", alpha=0.7)
    axes[-1].set_xlabel("optimizer step (dashed: cooling break, dotted: OOM backoff)")
    fig.suptitle(f"{report['run']['name']}: {report['run']['status']}")
    fig.savefig(path, dpi=80)
