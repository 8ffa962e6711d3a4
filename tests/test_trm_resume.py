"""An interrupted TRM run resumed from its checkpoint ends bit-identical to an uninterrupted one.

The checkpoint must carry weights, EMA, optimizer, lr step, the exploration RNG, the carry (slots
at different depths) and the data position. Runs in-process with a Lightning Trainer on 4x4 boards.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from lightning.pytorch.callbacks import ModelCheckpoint

from laptrain.families.trm import TRMSudokuModule
from laptrain.families.trm.ema import EMA
from laptrain.families.trm.sudoku import SudokuDataModule
from tests.conftest import quiet_trainer

SIZES = yaml.safe_load((Path(__file__).parents[1] / "conf/model/trm_sudoku.yaml").read_text())[
    "sizes"
]
TOTAL, STOP = 14, 7  # epochs of 5 steps: the stop is mid-epoch, the rest crosses two epoch ends


def build(init_seed: int) -> tuple[TRMSudokuModule, SudokuDataModule]:
    data = SudokuDataModule(
        board_size=4,
        givens=(5, 8),
        train_size=60,
        val_size=8,
        test_size=8,
        batch_size=16,
        eval_batch_size=8,
        steps_per_epoch=5,
        seed=3,
    )
    sizes = {"tiny": {**SIZES["tiny"], "hidden_size": 32, "n_sup": 4, "warmup_steps": 4}}
    torch.manual_seed(init_seed)
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=sizes)
    if init_seed == 0:
        # A halt head that fires for some slots from the start, so slots sit at different depths.
        with torch.no_grad():
            module.model.halt_head.bias.fill_(0.0)
            module.model.halt_head.weight.normal_(0.0, 1.0)
    return module, data


def fit(
    module: TRMSudokuModule,
    data,
    steps: int,
    ckpt_dir: Path,
    resume: Path | None = None,
    precision: str = "32-true",
):
    trainer = quiet_trainer(
        enable_checkpointing=True,
        max_steps=steps,
        precision=precision,
        max_epochs=-1,
        val_check_interval=1.0,
        default_root_dir=ckpt_dir,
        callbacks=[
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=1, save_top_k=-1, monitor=None)
        ],
    )
    trainer.fit(module, data, ckpt_path=resume)
    return trainer


def load(ckpt_dir: Path, step: int) -> dict:
    (path,) = ckpt_dir.glob(f"*step={step}.ckpt")
    return torch.load(path, weights_only=True)


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}/{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a == b, where


# 64-true converts the module after the checkpoint is restored (Lightning's Trainer._run), as a
# device move would: EMA, raw weights and carry must be placed after it, without a float32 trip.
@pytest.mark.parametrize(
    "precision",
    ["32-true", pytest.param("64-true", marks=pytest.mark.slow)],  # ~25 s each
)
def test_resume_mid_run_is_bit_identical(tmp_path: Path, precision: str) -> None:
    straight, data = build(0)
    fit(straight, data, TOTAL, tmp_path / "straight", precision=precision)

    first, data = build(0)
    fit(first, data, STOP, tmp_path / "interrupted", precision=precision)
    stopped = load(tmp_path / "interrupted", STOP)
    depths = stopped["trm"]["carry"]["steps"]
    assert depths.unique().numel() > 1, "slots should be at different depths at the stop"
    assert stopped["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 1

    second, data = build(1)  # different init: everything must come from the checkpoint
    path = next((tmp_path / "interrupted").glob(f"*step={STOP}.ckpt"))
    fit(second, data, TOTAL, tmp_path / "interrupted", resume=path, precision=precision)
    want = torch.float64 if precision == "64-true" else torch.float32
    assert second.carry.y.dtype == want

    a, b = load(tmp_path / "straight", TOTAL), load(tmp_path / "interrupted", TOTAL)
    assert {t.dtype for t in b["state_dict"].values() if t.is_floating_point()} == {want}
    assert b["trm"]["carry"]["y"].dtype == want
    ema_key = EMA.__qualname__
    assert_same(a["state_dict"], b["state_dict"], "EMA weights")
    assert_same(a["callbacks"][ema_key], b["callbacks"][ema_key], "raw weights + EMA counters")
    assert_same(a["optimizer_states"], b["optimizer_states"], "optimizer")
    assert_same(a["lr_schedulers"], b["lr_schedulers"], "lr schedule")
    assert_same(a["trm"], b["trm"], "carry + exploration RNG")
    # The raw weights really differ from the EMA, so both were compared.
    raw = a["callbacks"][ema_key]["raw_weights"]
    assert any(not torch.equal(raw[k], a["state_dict"][k]) for k in raw)
