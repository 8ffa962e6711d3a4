"""`laptrain why <run>`: each pattern (NaN, OOM backoff, divergence, overfitting, plateau, slowdown)
through the CLI on a run folder whose curves are made to show it, a healthy run found unremarkable,
bad folders refused in one line, and the reader on a real run of train.py.

The folders are written as a run leaves them: TensorBoard event files (torch's SummaryWriter, as
Lightning's TensorBoardLogger writes them) and ``report.json`` in ``RunReport.build``'s shape, with
the guards' sections and records made by the guards themselves (``summary()``, ``handle_oom``,
the NaN guard's hooks, a cooling break, the memory monitor's scalar names)."""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.tensorboard import SummaryWriter

from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.nonfinite_guard import NonFiniteGuard, NonFiniteLoss
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.commands import cli, why
from laptrain.hardware.probe import MemoryReading
from tests.conftest import TINY, write_texts
from tests.fakes import FakeProbe
from tests.in_process import train_here

MB = 1024**2
Curves = dict[str, list[tuple[int, float]]]
HOOKS = {"PYTHONPATH": str(Path(__file__).resolve().parents[1])}
# a parameter of model=tiny_classifier (a transformers BERT under TextClassifierModule.model)
TINY_PARAMETER = "model.bert.encoder.layer.0.output.dense.weight"


class InfGradAt(pl.Callback):
    """In the batch that makes optimizer step ``step`` (from 1), make the gradient of ``name``
    inf while the loss stays finite: an exploding gradient, as the NaN guard sees one."""

    def __init__(self, step: int, name: str) -> None:
        self.step, self.name = step, name

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step + 1 == self.step:
            dict(pl_module.named_parameters())[self.name].grad.fill_(float("inf"))


def report(
    *,
    status: str = "finished",
    step: int = 200,
    precision: str = "32-true",
    monitor: str = "val/acc",
    metrics: dict[str, float] | None = None,
    history: list[dict[str, Any]] | None = None,
    val_history: list[dict[str, Any]] | None = None,
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """A report.json as RunReport.build writes it; the guard sections are the guards' own."""
    return {
        "run": {
            "name": "run",
            "status": status,
            "sessions": 1,
            "global_step": step,
            "epoch": 1,
            "lr-AdamW/pg1": 0.001,
        },
        "hardware": {"profile": "cpu", "device": "cpu", "precision": precision},
        "time": {"wall_s": 60.0, "train_s": 50.0, "cooling_s": 0.0},
        "throughput": {"samples": 3200, "samples_per_s": 64.0},
        "memory": {"peak_process_rss_mb": 500.0, "source": "getrusage (memory monitor off)"},
        "thermal": ThermalGuard(use_os_source=False).summary(),
        "oom": OOMBackoff(probe=FakeProbe()).summary(),
        "power": {},
        "nonfinite": NonFiniteGuard().summary(),
        **sections,
        "checkpoint": {"last": "checkpoints/last.ckpt", "monitor": monitor, "best_score": 0.5},
        "metrics": metrics or {},
        "history": history or [],
        "val_history": val_history or [],
    }


def write_run(folder: Path, curves: Curves, report_json: dict[str, Any] | None) -> Path:
    """A run folder: ``curves`` in tensorboard/, ``report_json`` as report.json."""
    folder.mkdir(parents=True)
    if curves:
        writer = SummaryWriter(log_dir=str(folder / "tensorboard"))
        for tag, points in curves.items():
            for step, value in points:
                writer.add_scalar(tag, value, global_step=step)
        writer.close()
    if report_json is not None:
        (folder / "report.json").write_text(json.dumps(report_json, indent=2, default=str))
    return folder


def dpo_config(folder: Path) -> None:
    """The run's ``.hydra/config.yaml``: a DPO model, so the LoRA family's rules apply."""
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(
        "model:\n  _target_: laptrain.families.lora.dpo.DPOLoRAModule\n"
    )


def explain(folder: Path, capsys: pytest.CaptureFixture[str]) -> tuple[list[str], why.Finding]:
    """`laptrain why <folder>`'s lines (exit 0, nothing on stderr) and the first finding."""
    capsys.readouterr()
    assert cli.main(["why", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    lines = out.splitlines()
    assert 2 <= len(lines) <= why.MAX_LINES, lines
    assert lines[0].startswith(f"{folder}: ")
    findings = why.run_findings(why.read_run(folder))
    assert [f.line() for f in findings] == lines[1:]
    return lines[1:], findings[0]


def steps(start: int, stop: int, every: int = 2) -> list[int]:
    return list(range(start, stop + 1, every))


def falling(at: list[int], top: float = 2.0, floor: float = 0.3, scale: float = 100.0) -> list:
    """A loss falling smoothly from ``top`` towards ``floor``, with a small fixed wiggle."""
    return [(s, floor + (top - floor) * math.exp(-s / scale) + 0.01 * math.sin(s)) for s in at]


def test_a_healthy_run_is_nothing_unusual_with_its_final_metrics(tmp_path, capsys):
    evals = steps(20, 200, 20)
    val_loss = [(s, 1.0 * 0.95**i) for i, s in enumerate(evals)]
    val_acc = [(s, 0.5 + 0.035 * i) for i, s in enumerate(evals)]
    history = [{"step": s, "loss": 1.0, "samples_per_s": 200.0 + (s % 7)} for s in steps(2, 200)]
    metrics = {"train/loss": 0.33, "val/loss": 0.63, "val/acc": 0.815, "test/acc": 0.8}
    folder = write_run(
        tmp_path / "run",
        {
            "train/loss": falling(steps(0, 199)),
            "val/loss": val_loss,
            "val/acc": val_acc,
            "lr-AdamW/pg1": [(s, 1e-3) for s in steps(0, 199)],
        },
        report(metrics=metrics, history=history),
    )
    lines, finding = explain(folder, capsys)
    assert finding.kind == "ok" and finding.step == 200
    assert lines == [
        "nothing unusual found (step 200): final val/acc 0.815 · val/loss 0.63 · test/acc 0.8 "
        "· train/loss 0.33"
    ]


def test_an_old_report_s_nan_stop_names_the_step_the_lr_the_precision_and_the_fixes(
    tmp_path, capsys
):
    """A report written before the guard kept a ``stop`` record: only the status tells the stop."""
    assert NonFiniteLoss.__name__ == why.NONFINITE_STOP  # RunReport's status names the exception
    old = report(status=f"interrupted ({NonFiniteLoss.__name__})", step=57, precision="16-mixed")
    old["nonfinite"] = {"action": "stop", "skipped_steps": 0, "skipped": []}  # no "stop"
    folder = write_run(
        tmp_path / "run",
        {
            "train/loss": falling(steps(0, 56, 1)),
            "lr-AdamW/pg1": [(s, 1e-3 * s / 100) for s in steps(0, 56, 1)],
        },
        old,
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("nonfinite", 57, pytest.approx(5.6e-4))
    assert lines[0] == (
        "a NaN/inf loss or gradient stopped the run at step 57 (lr 0.00056, precision 16-mixed): "
        "usual fixes: model.optimizer.lr=5.6e-05 (10x lower), trainer.gradient_clip_val=1.0, "
        "hardware.precision=bf16-mixed or 32-true (16-bit overflow), a bad row in that batch, "
        "callbacks.nonfinite_guard.action=skip"
    )


def test_skipped_non_finite_steps_are_counted_from_the_guards_record(tmp_path, capsys):
    guard = NonFiniteGuard(action="skip")
    weight = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([weight], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the guard's "step skipped" warning
        for step in (37, 90):
            trainer = SimpleNamespace(
                global_step=step, world_size=1, precision_plugin=SimpleNamespace()
            )  # 32-true: no GradScaler
            guard.on_before_backward(trainer, None, torch.tensor(float("nan")))
            guard.on_before_optimizer_step(trainer, None, optimizer)
    folder = write_run(
        tmp_path / "run",
        {"lr-AdamW/pg1": [(s, 0.002) for s in steps(0, 120, 10)]},
        report(step=120, nonfinite=guard.summary()),
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step) == ("nonfinite", 37)
    assert lines[0].startswith(
        "2 non-finite step(s) skipped, the first at step 37 (loss is nan, lr 0.002, "
        "precision 32-true): usual fixes: model.optimizer.lr=0.0002 (10x lower)"
    )
    assert "action=skip" not in lines[0]  # it was on


def guard_stop(step: int, precision: str, lr: float, bad: str) -> dict[str, Any]:
    """The NaN guard's report section after it stopped at ``step``, made by its own hooks on a
    two-layer model: ``bad`` is "loss" (a NaN loss) or a parameter name (its gradient -inf)."""
    model = torch.nn.Sequential()
    model.add_module("encoder", torch.nn.Linear(2, 2))
    model.add_module("head", torch.nn.Linear(2, 1))
    decay, no_decay = (
        [model.encoder.weight, model.head.weight],
        [model.encoder.bias, model.head.bias],
    )
    optimizer = torch.optim.AdamW(
        [{"params": decay}, {"params": no_decay, "weight_decay": 0}], lr=lr
    )
    model(torch.ones(1, 2)).sum().backward()
    trainer = SimpleNamespace(
        global_step=step,
        world_size=1,
        current_epoch=0,
        optimizers=[optimizer],
        precision=precision,
        precision_plugin=SimpleNamespace(),  # no GradScaler: the gradients are checked
        fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(batch_idx=step)),
    )
    guard = NonFiniteGuard()
    with pytest.raises(NonFiniteLoss):
        if bad == "loss":
            guard.on_before_backward(trainer, model, torch.tensor(float("nan")))
        else:
            dict(model.named_parameters())[bad].grad.fill_(float("-inf"))
        guard.on_before_optimizer_step(trainer, model, optimizer)
    return guard.summary()


def test_a_recorded_gradient_stop_names_the_parameter_and_its_value_then_clipping(tmp_path, capsys):
    section = guard_stop(37, "16-true", 3e-4, "head.weight")
    folder = write_run(
        tmp_path / "run",
        {"train/loss": falling(steps(0, 36, 1)), "lr-AdamW/pg1": [(s, 1e-3) for s in steps(0, 36)]},
        report(status=f"interrupted ({NonFiniteLoss.__name__})", step=37, nonfinite=section),
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("nonfinite", 37, 3e-4)
    assert lines[0] == (
        "the NaN guard stopped the run at step 37: the gradient of head.weight was -inf "
        "(lr 0.0003, precision 16-true): fixes: trainer.gradient_clip_val=1.0, "
        "model.optimizer.lr=3e-05 (10x lower), hardware.precision=bf16-mixed instead of 16-true, "
        "callbacks.nonfinite_guard.action=skip"
    )  # the guard's lr and precision, not the logged lr or the report's 32-true


def test_a_recorded_loss_stop_at_step_0_points_at_the_data_not_the_lr(tmp_path, capsys):
    section = guard_stop(0, "32-true", 1e-3, "loss")
    assert section["stop"] == {
        "step": 0,
        "what": "loss",
        "value": "nan",
        "lr": [1e-3, 1e-3],
        "precision": "32-true",
    }
    folder = write_run(
        tmp_path / "run",
        {},
        report(status=f"interrupted ({NonFiniteLoss.__name__})", step=0, nonfinite=section),
    )
    lines, _ = explain(folder, capsys)
    assert lines[0] == (
        "the NaN guard stopped the run at step 0: the loss was nan (lr 0.001, precision 32-true): "
        "fixes: check the data (a bad row in the first batch: inputs or labels), check the "
        "model's initial weights (no update ran yet: not the lr), "
        "callbacks.nonfinite_guard.action=skip"
    )


def test_a_plateau_names_the_flat_value_the_evaluations_and_their_steps(tmp_path, capsys):
    evals = steps(20, 220, 20)
    values = [1.30, 1.10, 0.95, 0.85, 0.78, 0.692, 0.694, 0.693, 0.695, 0.691, 0.693]
    folder = write_run(
        tmp_path / "run",
        {"train/loss": falling(steps(0, 219)), "val/loss": list(zip(evals, values))},
        report(step=220, monitor="val/loss"),
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("plateau", 120, pytest.approx(0.693))
    assert lines == [
        "val/loss flat at 0.693 ± 0.002 over the last 6 evaluations (steps 120-220): no gain "
        "since step 120: stop earlier (trainer.max_steps / max_epochs), or raise "
        "model.optimizer.lr or use a bigger model to go further"
    ]


def test_a_dpo_run_pushing_both_answers_down_is_named_with_the_fix(tmp_path, capsys):
    """The known DPO failure: the margin grows while the chosen log-probability falls too."""
    points = steps(0, 40, 5)
    chosen = [-60.0 - 2.0 * i for i in range(len(points))]
    rejected = [-62.0 - 6.0 * i for i in range(len(points))]
    folder = write_run(
        tmp_path / "run",
        {
            "train/loss": falling(steps(0, 40)),
            "train/logps_chosen": list(zip(points, chosen)),
            "train/logps_rejected": list(zip(points, rejected)),
        },
        report(step=40, monitor="val/loss"),
    )
    dpo_config(folder)
    lines, finding = explain(folder, capsys)
    assert finding.kind == "dpo" and finding.step == 40
    assert lines[0].startswith("DPO: the chosen answers' log-probability fell -60 -> ")
    assert "model.beta" in lines[0] and "model.init_adapters=<run>" in lines[0]


def test_a_dpo_run_whose_chosen_answers_hold_is_not_flagged(tmp_path, capsys):
    points = steps(0, 40, 5)
    folder = write_run(
        tmp_path / "run",
        {
            "train/loss": falling(steps(0, 40)),
            "train/logps_chosen": [(s, -60.0 + 0.5 * i) for i, s in enumerate(points)],
            "train/logps_rejected": [(s, -62.0 - 6.0 * i) for i, s in enumerate(points)],
        },
        report(step=40, monitor="val/loss"),
    )
    dpo_config(folder)
    _, finding = explain(folder, capsys)
    assert finding.kind != "dpo"


def test_a_run_that_logged_to_csv_is_read_from_its_metrics_file(tmp_path, capsys):
    """``logger=csv``: Lightning's CSVLogger writes <run>/csv/metrics.csv, one column a metric."""
    folder = tmp_path / "run"
    (folder / "csv").mkdir(parents=True)
    rows = ["step,train/loss,val/loss"]
    rows += [f"{s},{1.0 / (1 + s / 50):.4f}," for s in steps(0, 219)]
    values = [1.30, 1.10, 0.95, 0.85, 0.78, 0.692, 0.694, 0.693, 0.695, 0.691, 0.693]
    rows += [f"{s},,{v}" for s, v in zip(steps(20, 220, 20), values)]
    (folder / "csv" / "metrics.csv").write_text("\n".join(rows) + "\n")
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step) == ("plateau", 120)
    assert lines[0].startswith("val/loss flat at 0.693 ± 0.002 over the last 6 evaluations")


def test_a_divergence_names_the_step_the_smoothed_loss_turned_and_the_lr(tmp_path, capsys):
    # falls to 0.5 by step 60, flat to step 140, then jumps to 1.0 and stays
    loss = [(s, 2.0 - 1.5 * s / 60) for s in steps(0, 58)]
    loss += [(s, 0.5) for s in steps(60, 140)] + [(s, 1.0) for s in steps(142, 200)]
    folder = write_run(
        tmp_path / "run",
        {"train/loss": loss, "lr-AdamW/pg1": [(s, 3e-3) for s in steps(0, 200)]},
        report(step=201),
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step) == ("divergence", 140)
    assert finding.value == pytest.approx(0.5, rel=1e-3)
    assert lines == [
        "train/loss rising after step 140: smoothed 0.5001 there, 0.9988 at step 200 (+100%), "
        "over +20% since step 144: lower model.optimizer.lr (it was 0.003 at step 144: try "
        "0.001) or set trainer.gradient_clip_val=1.0"
    ]  # above 0.6 from the second point past the jump


def test_overfitting_names_the_best_step_and_the_checkpoint_to_keep(tmp_path, capsys):
    evals = steps(30, 300, 30)
    values = [1.0, 0.8, 0.65, 0.55, 0.50, 0.52, 0.55, 0.60, 0.66, 0.70]
    folder = write_run(
        tmp_path / "run",
        {"train/loss": falling(steps(0, 299)), "val/loss": list(zip(evals, values))},
        report(step=300, monitor="val/loss"),
    )
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "best-step151.ckpt").touch()  # global_step: one above the log's
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("overfitting", 150, 0.5)
    assert lines[0].startswith(
        "overfitting: val/loss rising after step 150: 0.5 there, 0.7 at step 300 over 5 evaluations, while "
        "train/loss (smoothed) fell"
    )
    assert ": keep checkpoints/best-step151.ckpt; stop near step 150 next time" in lines[0]


def test_a_throughput_fall_names_the_stretch_and_the_thermal_and_memory_state_then(
    tmp_path, capsys
):
    at = steps(10, 400, 10)
    slow_from = 310
    history = [
        {"step": s, "loss": 0.5, "samples_per_s": 120.0 if s >= slow_from else 200.0 + s % 3}
        for s in at
    ]
    thermal = ThermalGuard(use_os_source=False, break_seconds=30.0)
    now = [0.0]
    thermal.clock, thermal.sleep = (lambda: now[0]), (lambda s: now.__setitem__(0, now[0] + s))
    trainer = SimpleNamespace(global_step=330, should_stop=False, callbacks=[])
    thermal._cool(trainer, "thermal state serious", 30.0)  # the guard's own event record
    monitor = MemoryMonitor(probe=FakeProbe())

    def memory(percent: float, swap_mb: float) -> dict[str, float]:
        reading = MemoryReading(
            rss=900 * MB,
            system_total=16000 * MB,
            system_available=int(16000 * MB * (1 - percent / 100)),
            system_percent=percent,
            swap_used=int(swap_mb * MB),
        )
        return monitor.metrics(reading)

    curves: Curves = {}
    for s in at:
        late = s >= slow_from
        scalars = {**memory(93.0 if late else 60.0, 2100.0 if late else 100.0)}
        scalars["thermal/state"] = 2.0 if late else 0.0
        for tag, value in scalars.items():
            curves.setdefault(tag, []).append((s, value))
    folder = write_run(
        tmp_path / "run", curves, report(step=400, history=history, thermal=thermal.summary())
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("throughput", 310, 120.0)
    assert lines[0] == (
        "samples/s fell from 201 (median, steps 10-200) to 120 (steps 310-400, -40%); then: "
        "thermal state serious, 1 cooling break(s), 30 s, swap 2100 MB (was 100), system memory "
        "93 % (was 60 %): the machine throttled: let it cool (hard, open surface; charger in), "
        "or lower hardware.batch_size; callbacks.thermal_guard paces it"
    )


def test_oom_backoffs_name_each_micro_batch_from_and_to(tmp_path, capsys):
    backoff = OOMBackoff(probe=FakeProbe())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the backoff's own warning
        backoff.handle_oom(
            "CUDA out of memory. Tried to allocate", 32, SimpleNamespace(global_step=11)
        )
        backoff.handle_oom(
            "CUDA out of memory. Tried to allocate", 16, SimpleNamespace(global_step=39)
        )
    folder = write_run(
        tmp_path / "run",
        {"train/loss": falling(steps(0, 99))},
        report(step=100, oom=backoff.summary()),
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("oom", 12, 8.0)
    assert lines[0] == (
        "out of memory 2 times, micro-batch 32 -> 16 at step 12, 16 -> 8 at step 40 (same "
        "effective batch): start there: hardware.batch_size=8 with "
        "trainer.accumulate_grad_batches x4 keeps the effective batch; or "
        "model.gradient_checkpointing=true, a shorter data.max_length"
    )


def test_without_a_report_the_logged_micro_batch_tells_the_backoff(tmp_path, capsys):
    folder = write_run(
        tmp_path / "run",
        {"oom/micro_batch": [(2, 32.0), (4, 32.0), (6, 16.0), (8, 16.0)]},
        None,
    )
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("oom", 6, 16.0)
    assert lines[0].startswith("out of memory at step 6 with micro-batch 32: continued at 16")
    capsys.readouterr()
    cli.main(["why", str(folder)])
    header = capsys.readouterr().out.splitlines()[0]
    assert header == f"{folder}: no report.json (killed before it wrote one?); logged to step 8"


def test_a_missing_or_non_run_folder_is_one_line_and_exit_2(tmp_path, capsys):
    assert cli.main(["why", str(tmp_path / "nothing")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: no run folder {tmp_path / 'nothing'}: ")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("x")
    assert cli.main(["why", str(tmp_path / "notes")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'notes'} has no run records (report.json, ")


def test_on_a_real_run_the_nan_stop_is_named_as_the_guard_named_it(tmp_path, capsys):
    """train.py with a learning rate that makes the loss NaN within a few steps: `laptrain why`
    names the step and learning rate of the guard's own error line, read from the real folder."""
    args = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        "run_name=nan",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "trainer.max_steps=20",
        "trainer.val_check_interval=4",
        "trainer.log_every_n_steps=1",
        "model.optimizer.lr=1e4",
    ]
    done = train_here(args, tmp_path)
    from laptrain.exit_codes import NONFINITE_EXIT

    assert done.returncode == NONFINITE_EXIT, done.stderr[-3000:]
    said = re.search(
        r"error: (loss is \S+|the gradient of \S+ is \S+) at global step (\d+) .*?"
        r"the learning rate (\S+) ",
        done.stderr,
    )
    assert said, done.stderr[-3000:]
    folder = tmp_path / "outputs" / "nan"
    records = why.read_run(folder)
    for name in ("train/loss", "lr-AdamW/pg1", "oom/micro_batch", "samples_per_s", "val/acc"):
        assert records.series.get(name), (name, sorted(records.series))
    assert records.precision == "32-true" and records.monitor == "val/acc"
    lines, finding = explain(folder, capsys)
    seen, step, lr = said.groups()
    assert (finding.kind, finding.step) == ("nonfinite", int(step))
    seen = seen.replace("loss is", "the loss was").replace(" is ", " was ")
    assert lines[0].startswith(
        f"the NaN guard stopped the run at step {step}: {seen} (lr {lr}, precision 32-true): "
    )


def test_on_a_real_run_an_inf_gradient_is_recorded_and_named_with_its_parameter(tmp_path, capsys):
    """train.py where one parameter's gradient turns inf at optimizer step 5 (the loss finite):
    report.json keeps the guard's record, and `laptrain why` names the step and the parameter,
    then gradient clipping first."""
    args = [
        "hardware=cpu",
        "data=text_csv",
        "run_name=inf",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "+callbacks.inf._target_=tests.test_why.InfGradAt",
        "+callbacks.inf.step=5",
        f"+callbacks.inf.name={TINY_PARAMETER}",
    ]
    done = train_here(args, tmp_path, env=HOOKS)
    from laptrain.exit_codes import NONFINITE_EXIT

    assert done.returncode == NONFINITE_EXIT, done.stderr[-3000:]
    assert f"error: the gradient of {TINY_PARAMETER} is inf at global step 4 " in done.stderr
    folder = tmp_path / "outputs" / "inf"
    stop = json.loads((folder / "report.json").read_text())["nonfinite"]["stop"]
    lr = stop.pop("lr")
    assert stop == {
        "step": 4,
        "what": "gradients",
        "parameter": TINY_PARAMETER,
        "value": "inf",
        "precision": "32-true",
    }
    assert lr and all(v > 0 for v in lr)
    lines, finding = explain(folder, capsys)
    assert (finding.kind, finding.step, finding.value) == ("nonfinite", 4, lr[0])
    assert lines[0] == (
        f"the NaN guard stopped the run at step 4: the gradient of {TINY_PARAMETER} was inf "
        f"(lr {lr[0]:.3g}, precision 32-true): fixes: trainer.gradient_clip_val=1.0, "
        f"model.optimizer.lr={lr[0] / 10:.3g} (10x lower), callbacks.nonfinite_guard.action=skip"
    )


CLIPS = " or set trainer.gradient_clip_val=1.0"
FSDP_STRATEGY = {"strategy": {"_target_": "lightning.pytorch.strategies.FSDPStrategy"}}


@pytest.mark.parametrize(
    ("accelerator", "precision", "fused", "trainer", "advice"),
    [
        # a fused AdamW under 16-mixed unscales in its own step: Lightning refuses to clip before it
        (
            "cuda",
            "16-mixed",
            True,
            {},
            " or set model.optimizer.fused=false trainer.gradient_clip_val=1.0",
        ),
        ("cuda", "16-mixed", False, {}, CLIPS),
        ("cuda", "bf16-mixed", True, {}, CLIPS),
        ("mps", "16-mixed", True, {}, CLIPS),  # the launch builds it unfused at 16-mixed on MPS
        ("cuda", "bf16-mixed", False, FSDP_STRATEGY, ""),  # FSDP refuses norm clipping
    ],
)
def test_clipping_is_suggested_only_in_a_form_lightning_runs(
    tmp_path, capsys, accelerator, precision, fused, trainer, advice
):
    """`laptrain why` on a diverging run reads the run's saved config: the fix it names must be
    one Lightning accepts for that optimizer, precision and strategy."""
    loss = [(s, 2.0 - 1.5 * s / 60) for s in steps(0, 58)]
    loss += [(s, 0.5) for s in steps(60, 140)] + [(s, 1.0) for s in steps(142, 200)]
    folder = write_run(
        tmp_path / "run",
        {"train/loss": loss, "lr-AdamW/pg1": [(s, 3e-3) for s in steps(0, 200)]},
        report(step=201, precision=precision),
    )
    config = {
        "model": {
            "_target_": "laptrain.families.classifier.text_classifier.TextClassifierModule",
            "optimizer": {"_target_": "torch.optim.AdamW", "fused": fused},
        },
        "trainer": {"accelerator": "${hardware.accelerator}", **trainer},
        "hardware": {"accelerator": accelerator, "precision": precision},
    }
    (folder / ".hydra").mkdir()
    (folder / ".hydra" / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
    lines, finding = explain(folder, capsys)
    assert finding.kind == "divergence"
    assert lines[0].endswith(f"try 0.001){advice}"), lines[0]
