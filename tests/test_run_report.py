"""RunReport: every field filled with all guards on, exact throughput, interrupts, two sessions."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import Callback, LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.loggers import CSVLogger
from matplotlib.image import imread
from torch.utils.data import DataLoader

from laptrain.callbacks.graceful_stop import GracefulStop
from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.oom_backoff import OOMBackoff
from laptrain.callbacks.report_writer import PLOT_ALT, render_markdown, token_count
from laptrain.callbacks.run_report import RunReport
from laptrain.callbacks.session_budget import SessionBudget
from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.families.lora.instructions import IGNORE, CausalLMCollator
from laptrain.hardware.probe import MemoryReading
from laptrain.hardware.thermal import ThermalReading
from laptrain.model.chunked_backward import ChunkedBackward
from tests.conftest import CONF_FIXTURES, TINY, TINY_LORA, quiet_trainer, write_texts
from tests.fakes import FakeProbe, FakeThermal
from tests.in_process import train_here

MB = 1024 * 1024
MPS_READING = MemoryReading(
    rss=900 * MB,
    system_total=16384 * MB,
    system_available=8192 * MB,
    system_percent=50.0,
    swap_used=64 * MB,
    device_allocated=300 * MB,
    device_reserved=400 * MB,
    device_limit=12288 * MB,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class Model(ChunkedBackward, BoringModel):
    """Batches of 8; each step takes 2 s on the fake clock; OOM once at step ``oom_step``."""

    def __init__(
        self, clock: FakeClock, oom_step: int | None = None, crash_step: int | None = None
    ):
        super().__init__()
        self.clock, self.oom_step, self.crash_step = clock, oom_step, crash_step

    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 64), batch_size=8)

    def training_step(self, batch, batch_idx):
        if self.global_step == self.crash_step:
            raise RuntimeError("boom")
        self.clock.now += 2.0
        loss = self.chunked_backward(batch, self.loss_of)
        self.log("train/loss", loss)
        return loss

    def loss_of(self, chunk):
        if self.global_step == self.oom_step and len(chunk) > 4:
            raise RuntimeError("MPS backend out of memory (MPS allocated: 1 GB). Tried to allocate")
        return self.step(chunk)

    def validation_step(self, batch, batch_idx):
        self.log("val/loss", self.step(batch))

    def test_step(self, batch, batch_idx):
        self.log("test/loss", self.step(batch))


def guards(clock: FakeClock, tmp_path, **budget) -> list:
    probe = FakeProbe(kind="mps", readings=[MPS_READING])
    return [
        MemoryMonitor(every_n_steps=2, probe=probe),
        ThermalGuard(
            source=FakeThermal([ThermalReading(0), ThermalReading(2), ThermalReading(0)]),
            check_every_n_steps=2,
            break_seconds=5,
            probe=probe,
            clock=clock,
            sleep=clock.sleep,
        ),
        OOMBackoff(probe=probe),
        SessionBudget(**budget, clock=clock),
        GracefulStop(),
        # as conf/callbacks/periodic_checkpoint.yaml (it rewrites last.ckpt at train end)
        ModelCheckpoint(
            dirpath=tmp_path / "checkpoints", every_n_train_steps=250, save_top_k=0, save_last=True
        ),
        RunReport(output_dir=str(tmp_path), profile="m2_air", every_n_steps=2, clock=clock),
    ]


def fit(tmp_path, clock, steps=8, resume=False, oom_step=3, crash_step=None, **budget):
    seed_everything(5)
    callbacks = guards(clock, tmp_path, **budget)
    trainer = quiet_trainer(
        enable_checkpointing=True,
        accelerator="cpu",
        max_steps=steps,
        limit_val_batches=2,
        val_check_interval=4,
        callbacks=callbacks,
        default_root_dir=tmp_path,
    )
    ckpt = str(tmp_path / "checkpoints" / "last.ckpt") if resume else None
    trainer.fit(Model(clock, oom_step=oom_step, crash_step=crash_step), ckpt_path=ckpt)
    return trainer, json.loads((tmp_path / "report.json").read_text())


def test_report_has_every_field_and_a_plot_that_opens(tmp_path):
    clock = FakeClock()
    trainer, report = fit(tmp_path, clock)
    assert report["run"]["status"] == "finished" and report["run"]["global_step"] == 8
    assert report["hardware"]["profile"] == "m2_air"
    assert {"python", "torch", "lightning", "laptrain"} <= report["versions"].keys()
    assert report["time"] == {"wall_s": 21.0, "train_s": 16.0, "cooling_s": 5.0}
    assert report["throughput"]["samples"] == 64
    assert report["throughput"]["samples_per_s"] == 4.0  # 8 samples per 2 s step
    assert report["memory"]["kind"] == "mps"
    assert report["memory"]["peak_device_allocated_mb"] == 300.0
    assert report["memory"]["peak_swap_used_mb"] == 64.0 and report["memory"]["swap_grew_mb"] == 0.0
    assert (
        report["thermal"]["cooling_breaks"] == 1 and report["thermal"]["worst_state"] == "serious"
    )
    assert report["oom"]["backoffs"] == 1 and report["oom"]["micro_batch"] == 4
    assert report["oom"]["events"][0]["step"] == 4  # global_step 3 while the 4th step ran
    assert set(report["metrics"]) == {"train/loss", "val/loss"}
    assert [p["step"] for p in report["history"]] == [2, 4, 6, 8]
    assert report["history"][0]["device_mb"] == 300.0 and report["history"][1]["thermal_state"] == 2
    # the validation curve: one point per validation (val_check_interval=4)
    assert [p["step"] for p in report["val_history"]] == [4, 8]
    assert report["val_history"][-1]["val/loss"] == report["metrics"]["val/loss"]
    assert report["run"]["epoch"] == 1 and report["run"]["max_steps"] == 8
    assert report["checkpoint"]["last"] == str(tmp_path / "checkpoints" / "last.ckpt")
    for section in ("run", "hardware", "time", "memory", "thermal", "oom"):
        # drift needs warmup + baseline + window steps (30 by default), more than this run has
        missing = [
            k
            for k, v in report[section].items()
            if v is None and k not in ("max_drift_pct", "baseline_step_s")
        ]
        assert not missing, (section, missing)

    markdown = (tmp_path / "report.md").read_text()
    assert f"![{PLOT_ALT}](report.png)" in markdown
    assert "| cooling_breaks | 1 |" in markdown and "| backoffs | 1 |" in markdown
    image = imread(tmp_path / "report.png")
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 300


def test_testing_an_older_checkpoint_only_adds_the_test_metrics(tmp_path):
    clock = FakeClock()
    trainer, report = fit(tmp_path, clock)
    checkpoint = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)
    checkpoint["callbacks"]["RunReport"]["totals"]["train_s"] = 1.0  # as if saved early on
    torch.save(checkpoint, tmp_path / "older.ckpt")
    plot = (tmp_path / "report.png").read_bytes()
    (tmp_path / "report.png").write_bytes(b"drawn at the end of fit")
    trainer.test(
        trainer.lightning_module, ckpt_path=str(tmp_path / "older.ckpt"), weights_only=False
    )
    after = json.loads((tmp_path / "report.json").read_text())
    assert after["time"] == report["time"] and after["throughput"] == report["throughput"]
    assert set(after["metrics"]) == {"train/loss", "val/loss", "test/loss"}
    assert "test/loss" in (tmp_path / "report.md").read_text()
    # the plot shows training and validation over steps: the test adds nothing to draw again
    assert plot and (tmp_path / "report.png").read_bytes() == b"drawn at the end of fit"


class CtrlC(Callback):
    """What GracefulStop records when SIGINT arrives (its handler only sets the attribute)."""

    def __init__(self, step: int) -> None:
        self.step, self.signal_received = step, None

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            self.signal_received = signal.SIGINT
            trainer.should_stop = True


def test_a_signal_stop_is_reported_as_interrupted(tmp_path):
    seed_everything(5)
    report = RunReport(output_dir=str(tmp_path), clock=FakeClock())
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=8,
        limit_val_batches=0,
        callbacks=[CtrlC(3), report],
        default_root_dir=tmp_path,
    )
    trainer.fit(Model(FakeClock()))
    written = json.loads((tmp_path / "report.json").read_text())["run"]
    assert written["status"] == "interrupted (SIGINT); resume with the same command"
    # 1-based: the 4 steps ran in the first epoch (Lightning's current_epoch says 1, 0-based)
    assert (written["global_step"], written["epoch"]) == (4, 1)
    # no memory monitor (as on the CPU profiles): the process's peak RSS, not a table of zeros
    memory = json.loads((tmp_path / "report.json").read_text())["memory"]
    assert set(memory) == {"peak_process_rss_mb", "source"} and memory["peak_process_rss_mb"] > 50


def test_an_exception_still_writes_the_report(tmp_path):
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, FakeClock(), crash_step=5)
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["run"]["status"] == "interrupted (RuntimeError)"
    assert report["run"]["global_step"] == 5 and report["throughput"]["samples"] == 40


def test_a_resumed_run_reports_all_its_sessions(tmp_path):
    clock = FakeClock()
    whole, whole_report = fit(tmp_path / "whole", clock)

    clock = FakeClock()
    first, report = fit(
        tmp_path / "chunked", clock, max_minutes=14 / 60
    )  # 4 steps + a 5 s break = 13 s
    assert first.global_step == 5
    assert report["run"]["status"] == "stopped (session); resume with the same command"
    assert report["run"]["sessions"] == 1

    clock.now += 1000.0  # the machine rested between sessions: not counted as wall time
    second, report = fit(tmp_path / "chunked", clock, resume=True, max_minutes=14 / 60)
    assert report["run"]["status"] == "finished" and report["run"]["sessions"] == 2
    assert report["run"]["global_step"] == whole.global_step == 8
    assert report["throughput"]["samples"] == whole_report["throughput"]["samples"] == 64
    assert report["time"]["train_s"] == whole_report["time"]["train_s"] == 16.0
    assert report["oom"]["backoffs"] == 1 and report["thermal"]["cooling_breaks"] == 1
    assert [p["step"] for p in report["history"]] == [2, 4, 6, 8]


def test_token_count_reads_the_attention_mask():
    batch = {
        "input_ids": torch.ones(2, 5, dtype=torch.long),
        "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]),
    }
    assert token_count(batch) == 8
    assert token_count({"input_ids": torch.ones(2, 5)}) == 10
    assert token_count(torch.ones(2, 5)) is None


def test_token_count_of_a_packed_batch_is_its_non_pad_positions():
    """data.packing: a 4D additive mask (sum -inf); the count comes from the rows' labels."""
    rows = [  # two examples (3 + 2 tokens) in one row, one example (4 tokens) in the other
        {"input_ids": [5, 6, 7, 8, 9], "labels": [IGNORE, 6, 7, IGNORE, 9], "lengths": [3, 2]},
        {"input_ids": [4, 4, 4, 4], "labels": [IGNORE, IGNORE, IGNORE, 4], "lengths": [4]},
    ]
    batch = CausalLMCollator(pad_token_id=0, pad_to_multiple_of=8, packed=True)(rows)
    assert batch["attention_mask"].dim() == 4 and batch["input_ids"].shape == (2, 8)
    assert int(token_count(batch)) == 9


def test_markdown_names_the_best_checkpoint_and_the_resume_command_and_leaves_out_lr():
    text = render_markdown(
        {
            "run": {"name": "r", "status": "finished", "epoch": 3, "max_epochs": 3},
            "checkpoint": {
                "best": "outputs/r/checkpoints/best-step90.ckpt",
                "monitor": "val/acc",
                "best_score": 0.75,
                "resume": "python train.py run_name=r",
            },
            "metrics": {"val/acc": 0.75},
        }
    )
    assert "Best checkpoint: `outputs/r/checkpoints/best-step90.ckpt` (val/acc 0.75)" in text
    assert "Resume (or rerun) with: `python train.py run_name=r`" in text
    assert "| epoch | 3 |" in text and "| max_epochs | 3 |" in text


def test_lr_is_not_a_final_metric(tmp_path):
    seed_everything(5)
    trainer = quiet_trainer(
        accelerator="cpu",
        max_steps=2,
        limit_val_batches=1,
        val_check_interval=2,
        callbacks=[LearningRateMonitor(), RunReport(output_dir=str(tmp_path), clock=FakeClock())],
        logger=CSVLogger(tmp_path),
        default_root_dir=tmp_path,
    )
    trainer.fit(Model(FakeClock()))
    report = json.loads((tmp_path / "report.json").read_text())
    assert "lr-SGD" in trainer.callback_metrics and "lr-SGD" in report["run"]
    assert not [k for k in report["metrics"] if k.startswith("lr")]
    assert "val/loss" in report["metrics"]


def test_markdown_renders_without_optional_sections():
    text = render_markdown(
        {"run": {"name": "r", "status": "finished"}, "metrics": {"val/acc": 0.5}}
    )
    assert "| val/acc | 0.5 |" in text and "## thermal" not in text
    assert "NaN guard" not in text


def test_markdown_shows_the_nan_guard_stop():
    stop = {"step": 37, "what": "gradients", "parameter": "head.weight", "value": "inf"}
    text = render_markdown({"run": {"name": "r", "status": "x"}, "nonfinite": {"stop": stop}})
    assert "## NaN guard stop" in text and '"parameter": "head.weight"' in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"every_n_steps": 0}, "run_report.every_n_steps"),
        ({"max_points": 2}, "run_report.max_points"),
    ],
)
def test_bad_values_name_their_config_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RunReport(**kwargs)


def test_train_py_on_an_apple_profile_with_fake_mps_reads_two_sessions(tmp_path):
    """Acceptance: `python train.py hardware=m2_air ...` on CPU, guards on, MPS reads faked."""
    args = [
        "hardware=m2_air",
        "hardware.accelerator=cpu",  # the test-only part: no MPS here ...
        "hardware.batch_size=8",
        f"hydra.searchpath=[file://{CONF_FIXTURES}]",  # test fixtures live in tests/conf
        "callbacks=fake_mps",  # ... and the guards' MPS reads answered by a FakeProbe
        "callbacks.thermal_guard.break_seconds=0.2",
        "callbacks.session_budget.max_epochs=1",
        "model=tiny_classifier",
        "data=text_csv",
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "run_name=guarded",
        "trainer.max_epochs=2",
        "trainer.log_every_n_steps=5",
        *TINY,
    ]
    first = train_here(args, tmp_path)
    assert first.returncode == 75, first.stderr[-3000:]  # paused by the session budget
    assert "Resume with the same command" in first.stdout + first.stderr
    run = tmp_path / "outputs" / "guarded"
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "stopped (session); resume with the same command"
    steps_first = report["run"]["global_step"]

    second = train_here(args, tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report["run"]["status"] == "finished" and report["run"]["sessions"] == 2
    assert report["run"]["global_step"] == 2 * steps_first
    assert report["hardware"]["profile"] == "m2_air" and report["memory"]["kind"] == "mps"
    assert (
        report["thermal"]["cooling_breaks"] >= 1 and report["thermal"]["worst_state"] == "serious"
    )
    assert report["throughput"]["tokens_per_s"] > 0 and "test/acc" in report["metrics"]
    for section in ("run", "hardware", "versions", "time", "throughput", "memory", "oom"):
        assert all(v is not None for v in report[section].values()), section
    assert f"![{PLOT_ALT}](report.png)" in (run / "report.md").read_text()
    assert imread(run / "report.png").ndim == 3


def test_train_py_with_packing_finishes_and_reports_real_tokens(tmp_path):
    """`python train.py experiment=lora_offline data.packing=true` with the default callbacks."""
    args = [
        *TINY_LORA,
        "data.builder.modules=[json,csv,base64,shlex]",
        "data.vocab_size=512",
        "data.max_length=64",
        "data.batch_size=4",
        "data.packing=true",
        "trainer.max_steps=3",
        "trainer.val_check_interval=3",
        "test=false",
        "run_name=packed",
    ]
    done = train_here(args, tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    throughput = json.loads((tmp_path / "outputs" / "packed" / "report.json").read_text())[
        "throughput"
    ]
    # packed rows of at most 64 tokens: fewer real tokens than positions, more than one per row
    assert throughput["samples"] < throughput["tokens"] <= 64 * throughput["samples"]
    assert throughput["tokens_per_s"] > 0
