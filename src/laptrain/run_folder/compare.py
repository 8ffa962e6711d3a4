"""``laptrain runs compare A B [C ...]``: runs side by side (the config keys whose values differ,
final metrics, best score, samples/s, peak memory, wall time), read from the files a run leaves,
and one plot of their validation curves (matplotlib's object API on the Agg canvas)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from laptrain.run_folder.listing import _yaml, json_record, resolve_run, run_state, section

MISSING = "—"
_ABSENT = object()  # a key one run's config lacks (a null value is a value)


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """``{"model": {"lr": 1e-3}}`` -> ``{"model.lr": 1e-3}``; lists and empty mappings are
    values."""
    if not isinstance(config, Mapping) or (prefix and not config):
        return {prefix: config}
    flat: dict[str, Any] = {}
    for key, value in config.items():
        flat.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return flat


def _text(value: Any) -> str:
    if value is _ABSENT:
        return MISSING
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return json.dumps(value)
    return str(value)


def config_differences(configs: Sequence[Mapping[str, Any]]) -> list[tuple[str, list[str]]]:
    """``(dotted key, one value per run)`` for each key whose values differ, in config order."""
    flat = [flatten(c or {}) for c in configs]
    keys = list(dict.fromkeys(k for f in flat for k in f))
    rows = []
    for key in keys:
        values = [f.get(key, _ABSENT) for f in flat]
        if any(v != values[0] or type(v) is not type(values[0]) for v in values[1:]):
            rows.append((key, [_text(v) for v in values]))
    return rows


def _number(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)):
        return MISSING
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def metric_rows(folders: Sequence[Path]) -> list[tuple[str, list[str]]]:
    """``(row name, one cell per run)``: status and step (as ``laptrain runs`` shows them), the best
    checkpoint's score, each final metric, samples/s, peak memory and wall time."""
    reports = [json_record(f / "report.json") for f in folders]
    states = [run_state(f) for f in folders]
    finals = []
    for folder, report in zip(folders, reports):
        final = json_record(folder / "metrics.json") or dict(section(report, "metrics"))
        finals.append({k: v for k, v in final.items() if not k.startswith("hp/")})
    rows: list[tuple[str, list[str]]] = [
        ("status", [s.status for s in states]),
        ("step", [MISSING if s.step is None else str(s.step) for s in states]),
    ]
    best: dict[str, list[str]] = {}
    for i, (state, report) in enumerate(zip(states, reports)):
        ckpt = section(report, "checkpoint")
        if ckpt.get("best_score") is not None:
            monitor, score = str(ckpt.get("monitor")), _number(float(ckpt["best_score"]))
        elif state.best:  # a run killed before its report: the checkpoint's record
            monitor, _, score = state.best.rpartition(" ")
        else:
            continue
        best.setdefault(monitor, [MISSING] * len(folders))[i] = score
    rows += [(f"best {monitor}", cells) for monitor, cells in best.items()]
    for name in sorted({k for f in finals for k in f}):
        rows.append((name, [_number(f.get(name)) for f in finals]))
    memory = [section(r, "memory") for r in reports]
    rows += [
        ("samples/s", [_number(section(r, "throughput").get("samples_per_s")) for r in reports]),
        (
            "peak RSS (MB)",
            [_number(m.get("peak_rss_mb", m.get("peak_process_rss_mb"))) for m in memory],
        ),
    ]
    if any(m.get("peak_device_peak_mb") is not None for m in memory):
        rows.append(("peak device (MB)", [_number(m.get("peak_device_peak_mb")) for m in memory]))
    rows.append(("wall time (fit)", [_duration(section(r, "time").get("wall_s")) for r in reports]))
    return rows


def markdown_table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[str]]]) -> str:
    """A Markdown table, its columns padded so that it reads as plain text too."""
    lines = [list(header), *([name, *cells] for name, cells in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def val_curves(folder: Path) -> list[dict[str, Any]]:
    """The run's validation points (``[{"step": 2, "val/acc": 0.5, ...}]``) from its report."""
    points = (json_record(folder / "report.json") or {}).get("val_history")
    return [p for p in points if isinstance(p, Mapping)] if isinstance(points, list) else []


def plot_curves(
    curves: Sequence[list[dict[str, Any]]], labels: Sequence[str], path: Path
) -> list[str]:
    """One panel per ``val/*`` metric, one line per run, into ``path``; the metrics plotted."""
    metrics = sorted(
        {k for points in curves for p in points for k in p if k.startswith("val/")},
        key=lambda k: (k != "val/loss", k),
    )
    if not metrics:
        return []
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 1.2 + 2.2 * len(metrics)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(len(metrics), 1, sharex=True, squeeze=False)[:, 0]
    for ax, metric in zip(axes, metrics):
        for points, label in zip(curves, labels):
            xy = [(p["step"], p[metric]) for p in points if p.get(metric) is not None]
            if xy:
                ax.plot(*zip(*xy), label=label, marker="o" if len(xy) < 30 else None)
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    axes[-1].set_xlabel("optimizer step")
    fig.suptitle("validation curves: " + ", ".join(labels))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    return metrics


def run_label(folder: Path, root: Path) -> str:
    """The run's name as ``laptrain runs`` shows it: relative to ``root``, else the path."""
    try:
        return folder.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(folder)


def compare_command(names: Sequence[str], root: str | Path, out: str | Path) -> int:
    """Print the config differences and the metrics table of the named runs; write the plot."""
    import sys

    root = Path(root)
    if len(names) < 2:
        print("error: name two runs or more to compare (laptrain runs lists them)", file=sys.stderr)
        return 2
    try:
        folders = [resolve_run(name, root) for name in names]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    labels = [run_label(f, root) for f in folders]
    configs = [_yaml(f / ".hydra" / "config.yaml") for f in folders]
    differences = config_differences([c if isinstance(c, Mapping) else {} for c in configs])
    print("config: the keys that differ")
    if differences:
        print(markdown_table(["key", *labels], differences))
    else:
        print("(none: the configs are the same)")
    without = [label for label, c in zip(labels, configs) if not isinstance(c, Mapping)]
    if without:
        print(f"(no .hydra/config.yaml: {', '.join(without)})")
    print()
    print(markdown_table(["", *labels], metric_rows(folders)))
    print()
    curves = [val_curves(f) for f in folders]
    none = [label for label, points in zip(labels, curves) if not points]
    note = f" (no validation points in the report of {', '.join(none)})" if none else ""
    if plot_curves(curves, labels, Path(out)):
        print(f"validation curves: {out}{note}")
    else:
        print("validation curves: none recorded in these runs' reports; no plot written")
    return 0
