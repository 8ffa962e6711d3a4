"""`python train.py experiment=lora_offline`, stopped by SIGTERM mid-run and rerun, ends with the
same adapter as an uninterrupted run; rerunning the folder on another base is refused.

Tiny sizes: a 32-wide 1-layer base pretrained a few steps, a handful of stdlib modules, 12 LoRA
steps with validation (and so a top-k checkpoint with its adapter folder) every 4. LoRA dropout
is on, so the dropout RNG has to come back from the checkpoint too.

Measured: equal on the first try. The stopped run also validates at step 6 (Lightning validates
when ``should_stop`` is set) and leaves a ``best-step6.ckpt``; ``last.ckpt`` was saved before that
validation, so the rerun's top-k ranking (and the best checkpoint it tests) matches the straight
run's, and the orphaned file is never chosen.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import TINY_LORA, run_train
from tests.in_process import train_here
from tests.same_state import assert_same

TOTAL, STOP = 12, 6
RUN = ["run_name=lora"]
JOB = [
    *TINY_LORA,
    "data.builder.modules=[json,csv,base64,shlex,heapq,bisect,textwrap,fnmatch,glob,copy]",
    "data.vocab_size=512",
    "data.max_length=64",
    "data.batch_size=4",
    f"trainer.max_steps={TOTAL}",
    "trainer.val_check_interval=4",
    "trainer.log_every_n_steps=2",
    "trainer.deterministic=true",
    "test=false",
]


# The same job trained with the DPO loss on the offline preference pairs (issue 38, item 5).
DPO_JOB = [a.replace("experiment=lora_offline", "experiment=dpo_offline") for a in JOB]
JOBS = pytest.mark.parametrize("job", [JOB, DPO_JOB], ids=["lora", "dpo"])


class SigtermAt(pl.Callback):
    """Sends this process SIGTERM as the batch that makes ``global_step`` reach ``step`` begins:
    GracefulStop finishes that batch and saves ``last.ckpt`` at exactly ``step``."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step == self.step - 1:
            os.kill(os.getpid(), signal.SIGTERM)


SIGTERM_AT = [
    f"+callbacks.sigterm_at._target_={__name__}.SigtermAt",  # train.py's folder is on sys.path
    f"+callbacks.sigterm_at.step={STOP}",
]


def train(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    # One thread: two concurrent runs on a shared machine should not fight over cores.
    return run_train(args, cwd, env={"OMP_NUM_THREADS": "1"})


def final_weights(run: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], int]:
    """The exported adapter, last.ckpt (adapter weights, optimizer, schedulers), and its step."""
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    adapter = load_file(str(run / "adapter" / "adapter_model.safetensors"))
    return adapter, ckpt, int(ckpt["global_step"])


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys(), what
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{what}: {len(differ)} of {len(a)} tensors differ, e.g. {differ[0]}"


@pytest.mark.slow  # ~37 s; the DDP and classifier resume tests stay in the fast suite
@JOBS
def test_sigterm_then_rerun_gives_the_uninterrupted_adapter_and_another_base_is_refused(
    tmp_path: Path, job: list[str]
) -> None:
    straight_dir, stopped_dir = tmp_path / "straight", tmp_path / "stopped"
    for folder in (straight_dir, stopped_dir):
        folder.mkdir()
        # one cache: the tokenizer, data and base are built once (the base has a content key)
        (folder / "cache").symlink_to(tmp_path / "cache", target_is_directory=True)
    (tmp_path / "cache").mkdir()

    straight = train_here([*job, *RUN], straight_dir)
    assert straight.returncode == 0, straight.stderr[-3000:]
    want_adapter, want_ckpt, step = final_weights(straight_dir / "outputs" / "lora")
    assert step == TOTAL and want_ckpt["state_dict"]

    stopped = train([*job, *RUN, *SIGTERM_AT], stopped_dir)  # a process: SIGTERM ends it
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    run = stopped_dir / "outputs" / "lora"
    ckpt = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert ckpt["global_step"] == STOP
    assert not (run / "adapter").exists()  # the final adapter is written only when a run ends

    resumed = train_here([*job, *RUN], stopped_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"global step {STOP}," in resumed.stdout
    got_adapter, got_ckpt, step = final_weights(run)
    assert step == TOTAL
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_same(want_ckpt[key], got_ckpt[key], key)  # weights, AdamW moments, schedule
    assert_equal(want_adapter, got_adapter, "adapter/adapter_model.safetensors")
    # the step adapters beside the checkpoints hold the same weights
    step_adapter = load_file(
        str(run / "adapters" / f"step-{TOTAL:06d}" / "adapter_model.safetensors")
    )
    assert_equal(want_adapter, step_adapter, f"adapters/step-{TOTAL:06d}")

    other = [a for a in job if not a.startswith("model.tiny_base.hidden_size")]
    refused = train_here(
        [*other, "model.tiny_base.hidden_size=48", *RUN, f"trainer.max_steps={TOTAL + 4}"],
        stopped_dir,
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "base" in errors[0], refused.stderr[-3000:]


@pytest.mark.slow  # ~27 s; ddp_cpu itself stays in the suite (test_train_e2e)
@JOBS
def test_lora_trains_on_two_ddp_processes_through_train_py(tmp_path, job):
    """`trainer=ddp_cpu` (Lightning's ddp_spawn, 2 CPU processes): 4 steps, one checkpoint, the
    adapter exported once (rank 0)."""
    done = train([*job, *RUN, "trainer=ddp_cpu", "trainer.max_steps=4"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "effective batch size: 8" in done.stdout  # 4 per process x 2 processes
    assert "oom_backoff: inactive with more than one process" in done.stdout + done.stderr
    _, state, step = final_weights(tmp_path / "outputs" / "lora")
    assert step == 4 and state["state_dict"] and all("lora_" in k for k in state["state_dict"])


@pytest.mark.slow  # ~60 s: two processes, then one
@JOBS
def test_two_ddp_processes_end_where_one_process_ends(tmp_path: Path, job: list[str]) -> None:
    """2 processes at micro batch 4 train the adapter one process at 8 trains: each rank's loss is
    its share of the step (response tokens for LoRA, pairs for DPO) and DDP averages the ranks'
    gradients. LoRA dropout off: each rank draws its own masks, one process draws other ones."""
    same = [*job, "model.lora.dropout=0", "trainer.max_steps=4"]
    two = train([*same, "run_name=two", "trainer=ddp_cpu"], tmp_path)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "effective batch size: 8" in two.stdout
    one = train_here([*same, "run_name=one", "data.batch_size=8"], tmp_path)
    assert one.returncode == 0, one.stderr[-3000:]
    assert "effective batch size: 8" in one.stdout
    two_w, _, two_step = final_weights(tmp_path / "outputs" / "two")
    one_w, _, one_step = final_weights(tmp_path / "outputs" / "one")
    assert two_step == one_step == 4 and one_w.keys() == two_w.keys()
    # lora_B starts at zero: what it holds now is what 4 steps learnt, far above the bound
    assert max(w.abs().max().item() for k, w in one_w.items() if "lora_B" in k) > 1e-3
    worst = max((one_w[k].double() - two_w[k].double()).abs().max().item() for k in one_w)
    assert worst < 1e-5, worst


@pytest.mark.parametrize(
    "job",
    [JOB, pytest.param(DPO_JOB, marks=pytest.mark.slow)],  # DPO's SIGTERM twin is slow too
    ids=["lora", "dpo"],
)
def test_a_paused_lora_run_resumes_to_the_uninterrupted_adapter_and_optimizer(
    tmp_path: Path, job: list[str]
):
    """The fast twin of the SIGTERM case above (no signal, so in process): a session budget spent
    at once pauses the run at its first batch boundary (exit 75); the same command then ends with
    every tensor of the straight run's last.ckpt (adapters, AdamW moments, schedule), dropout
    on."""
    straight = train_here([*job, "run_name=straight"], tmp_path)
    assert straight.returncode == 0, straight.stderr[-3000:]
    paused = train_here(
        [*job, "run_name=paused", "callbacks.session_budget.max_minutes=0.00001"], tmp_path
    )
    assert paused.returncode == 75, paused.stderr[-3000:]
    last = tmp_path / "outputs" / "paused" / "checkpoints" / "last.ckpt"
    assert 0 < torch.load(last, map_location="cpu", weights_only=True)["global_step"] < TOTAL
    resumed = train_here([*job, "run_name=paused"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stdout
    want = final_weights(tmp_path / "outputs" / "straight")
    got = final_weights(tmp_path / "outputs" / "paused")
    assert want[2] == got[2] == TOTAL
    for key in ("state_dict", "optimizer_states", "lr_schedulers"):
        assert_same(want[1][key], got[1][key], key)
    assert_equal(want[0], got[0], "adapter/adapter_model.safetensors")
