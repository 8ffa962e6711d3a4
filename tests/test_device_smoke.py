"""benchmarks/device_smoke.py on CPU at tiny sizes: the table a Mac or GPU user pastes into a report."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from omegaconf import OmegaConf
from smoke_harness import builds
from smoke_harness.builds import SMOKE_BUILDS, SmokeBuild
from smoke_harness.cells import PRECISIONS_BY_DEVICE, run_cell, smoke_fit
from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

from laptrain.callbacks.memory_monitor import MemoryMonitor
from laptrain.callbacks.thermal_guard import ThermalGuard
from laptrain.families import smoke_data
from laptrain.hardware.probe import TorchProbe
from laptrain.launch.device import without_unsafe_fused
from laptrain.project import conf_dir

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "device_smoke.py"


def smoke_main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("device_smoke", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main(argv)


def row(out: str, family: str) -> list[str]:
    line = next(s for s in out.splitlines() if s.startswith(f"| {family} |"))
    return [cell.strip() for cell in line.strip("|").split(" | ")][1:]


def test_cpu_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert smoke_main(["--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: cpu - ")
    assert "torch " in out and "lightning " in out and "OS: " in out
    header = next(s for s in out.splitlines() if s.startswith("| family |"))
    assert header == "| family | 32-true | bf16-mixed | 64-true | 16-mixed |"
    for family in ("classifier", "trm"):
        cells = row(out, family)
        assert cells[0].startswith("ok (") and cells[2].startswith("ok ("), cells
        assert cells[3].startswith("refused: hardware.precision=16-mixed"), cells
    assert row(out, "trm")[1].startswith("refused: TRM runs float32 on cpu")
    assert "failed" not in out
    # the legend says what the cells ran
    legend = out.split("\n\n")[-1]
    assert "memory monitor, thermal guard" in legend
    assert "classifier: tiny_classifier preset: fused AdamW, dropout 0.1" in legend
    assert "gradient checkpointing on" in legend
    assert "lora: llama32_3b_lora preset: base bfloat16 (preset: auto), adapters float32" in legend
    assert "lora dropout 0.05" in legend and "packed batches" in legend and "4-D" in legend
    assert "trm: trm_sudoku preset, size tiny" in legend


def test_one_failing_cell_does_not_stop_the_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def build(seed: int, steps: int):
        raise RuntimeError("boom on this device\nsecond line")

    monkeypatch.setitem(
        SMOKE_BUILDS, "broken", SmokeBuild("broken", build, SMOKE_BUILDS["trm"].predict)
    )
    assert builds.SMOKE_BUILDS["broken"].name == "broken"
    code = smoke_main(["--families", "broken,trm", "--precisions", "32-true", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert row(out, "broken") == ["failed: RuntimeError: boom on this device"]
    assert row(out, "trm")[0].startswith("ok (")
    assert "### broken / 32-true" in out and "second line" in out  # the traceback follows


def test_unknown_family_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        smoke_main(["--families", "nope"])
    assert "unknown families ['nope']" in capsys.readouterr().err


# ----- the cells run what the presets run -------------------------------------------------------
def preset(name: str) -> Any:
    return OmegaConf.load(conf_dir() / "model" / f"{name}.yaml")


def checkpointing_on(model: torch.nn.Module) -> bool:
    """transformers' own test (``PreTrainedModel.is_activation_checkpointing``)."""
    return any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def test_the_classifier_cell_is_the_preset_with_fused_adamw_dropout_and_checkpointing() -> None:
    module, _ = SMOKE_BUILDS["classifier"].make(0, 1, "cpu", "32-true")
    optimizer = module.optimizer_factory([torch.nn.Parameter(torch.zeros(2))])
    want = preset("tiny_classifier")
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True and want.optimizer.fused is True
    assert optimizer.defaults["lr"] == want.optimizer.lr
    assert optimizer.defaults["weight_decay"] == want.optimizer.weight_decay
    config = module.model.config
    assert config.hidden_dropout_prob == want.backbone.hidden_dropout_prob > 0
    assert config.attention_probs_dropout_prob == want.backbone.attention_probs_dropout_prob > 0
    assert config.hidden_size == 32  # smoke size, not the preset's 128
    assert module.gradient_checkpointing and checkpointing_on(module.model)


@pytest.mark.parametrize("kind", ["cpu", "cuda", "mps"])
def test_fused_adamw_follows_the_launch_rule(kind: str) -> None:
    """The smoke's rule is the launch's (laptrain.launch.device.without_unsafe_fused, which the
    device_smoke floor cannot import): fused on, except 16-mixed on MPS."""
    model_cfg = smoke_data.preset_config("tiny_classifier")
    assert set(smoke_data.FUSED_DEVICES) <= set(_get_fused_kernels_supported_devices())
    for precision in (*PRECISIONS_BY_DEVICE[kind], "bf16-true", "64-true"):
        ours = smoke_data.smoke_fused(model_cfg, kind, precision)["optimizer"]["fused"]
        launch = without_unsafe_fused(model_cfg, kind, precision, say=lambda _: None)
        assert ours == launch["optimizer"]["fused"], (kind, precision)
    module, _ = SMOKE_BUILDS["classifier"].make(0, 1, kind, "16-mixed")
    optimizer = module.optimizer_factory([torch.nn.Parameter(torch.zeros(2))])
    assert optimizer.defaults["fused"] is (kind != "mps")


def test_the_lora_cell_has_a_bf16_base_lora_dropout_checkpointing_and_packed_batches() -> None:
    module, data = SMOKE_BUILDS["lora"].make(0, 1, "cpu", "32-true")
    assert TorchProbe("cpu").bf16_supported()
    frozen = [p for p in module.parameters() if not p.requires_grad]
    adapters = [p for p in module.parameters() if p.requires_grad]
    assert frozen and {p.dtype for p in frozen} == {torch.bfloat16}
    assert adapters and {p.dtype for p in adapters} == {torch.float32}  # peft keeps them fp32
    want = preset("llama32_3b_lora")
    dropouts = [
        m.p
        for name, m in module.named_modules()
        if "lora_dropout" in name and isinstance(m, torch.nn.Dropout)
    ]
    assert dropouts and set(dropouts) == {want.lora.dropout} and want.lora.dropout > 0
    assert module.model.peft_config["default"].r == want.lora.r
    assert module.gradient_checkpointing and checkpointing_on(module.model)
    batch = next(iter(data.train_dataloader()))
    rows, width = batch["input_ids"].shape
    assert batch["attention_mask"].shape == (rows, 1, width, width)  # the collator's 4-D mask
    assert batch["position_ids"].shape == (rows, width)
    # several examples in a row: positions restart inside it, and the mask blocks across them
    assert (batch["position_ids"][:, 1:] == 0).any()
    assert (batch["attention_mask"] < 0).any()


def test_the_lora_base_stays_float32_where_the_device_has_no_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(TorchProbe, "bf16_supported", lambda self: False)
    module, _ = SMOKE_BUILDS["lora"].make(0, 1, "cpu", "32-true")
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert "base float32" in SMOKE_BUILDS["lora"].note("cpu")


def test_the_trm_cell_follows_its_preset_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change to conf/model/trm_sudoku.yaml reaches the smoke build: nothing is restated."""
    text = (conf_dir() / "model" / "trm_sudoku.yaml").read_text()
    (tmp_path / "model").mkdir()
    changed = text.replace("exploration_prob: 0.1 ", "exploration_prob: 0.3 ", 1)
    changed = changed.replace("loss: stablemax ", "loss: softmax ", 1)
    assert changed != text
    (tmp_path / "model" / "trm_sudoku.yaml").write_text(changed)
    monkeypatch.setattr(smoke_data, "conf_dir", lambda: tmp_path)
    module, _ = SMOKE_BUILDS["trm"].make(0, 1, "cpu", "32-true")
    assert module.hparams.exploration_prob == 0.3 and module.hparams.loss == "softmax"
    assert module.hparams.sizes["tiny"]["hidden_size"] == 32  # smoke size
    assert module.hparams.sizes["tiny"]["ema_decay"] == preset("trm_sudoku").sizes.tiny.ema_decay


class Seen(pl.Callback):
    """What the fit ran with, read at the end of each fit."""

    def __init__(self) -> None:
        self.fits: list[dict[str, pl.Callback]] = []

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.fits.append({type(c).__name__: c for c in trainer.callbacks})


def test_the_guards_read_the_device_in_every_fit(tmp_path: Path) -> None:
    seen = Seen()
    family = dataclasses.replace(SMOKE_BUILDS["classifier"], callbacks=lambda: [seen])
    smoke_fit(family, "32-true", "cpu", steps=1, workdir=tmp_path)
    assert len(seen.fits) == 2  # the first fit and the resumed one
    for fit in seen.fits:
        memory, thermal = fit["MemoryMonitor"], fit["ThermalGuard"]
        assert isinstance(memory, MemoryMonitor) and isinstance(thermal, ThermalGuard)
        assert {"NonFiniteGuard", "OOMBackoff"} <= set(fit)
        assert memory.probe.kind == "cpu"
        assert "memory/rss_mb" in memory.last and memory.cleanups >= 1  # read; cache emptied
        assert thermal.drift.seen >= 1  # synchronised and timed a step


@pytest.mark.parametrize("call", ["memory", "synchronize", "empty_cache"])
def test_a_device_whose_guard_calls_break_fails_its_cell(
    call: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: TorchProbe) -> None:
        raise RuntimeError(f"{call} broke on this device")

    monkeypatch.setattr(TorchProbe, call, broken)
    cell = run_cell(SMOKE_BUILDS["classifier"], "32-true", "cpu", 1, tmp_path)
    assert cell.status == "failed", cell
    assert cell.detail == f"RuntimeError: {call} broke on this device"
