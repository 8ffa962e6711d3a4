"""Ranks that torchrun or srun start together train with rank 0's preflight plan (issue 36, item 3).

They all start at once, so none can read the preflight.json rank 0 writes: each sized its own
micro batch, accumulation and gradient checkpointing from its own GPU's free memory, and ranks
with different batches run different epoch lengths (DDP's collectives hang or pair up wrong).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed

from laptrain.preflight import shared_plan
from laptrain.preflight.batch import PreflightError
from tests.conftest import ROOT, TINY_LORA, TRAIN

LAUNCHERS = ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_JOB_NAME")
LAUNCHERS += ("WORLD_SIZE", "LOCAL_RANK", "RANK")


class Wire:
    """``broadcast_object_list(src=0)`` between stand-in ranks run one after the other."""

    def __init__(self) -> None:
        self.sent: list = []
        self.rank = 0

    def broadcast_object_list(self, objects: list, src: int = 0) -> None:
        assert src == 0
        if self.rank == 0:
            self.sent.append(list(objects))
        else:
            objects[:] = self.sent.pop(0)


@pytest.fixture
def wire(monkeypatch):
    line = Wire()
    monkeypatch.setattr(torch.distributed, "get_rank", lambda: line.rank)
    monkeypatch.setattr(torch.distributed, "broadcast_object_list", line.broadcast_object_list)
    return line


def test_rank_1_takes_the_plan_rank_0_made_and_measures_nothing(wire):
    rank_0_plan = SimpleNamespace(micro_batch=32, accumulation=2, notes=[])
    assert shared_plan.rank_0_answer(lambda: rank_0_plan) is rank_0_plan
    wire.rank = 1
    got = shared_plan.rank_0_answer(lambda: pytest.fail("rank 1 planned on its own"))
    assert (got.micro_batch, got.accumulation) == (32, 2)
    assert got.notes == [shared_plan.RANK_0_NOTE]


def test_rank_0_s_refusal_stops_every_rank_with_the_same_line(wire):
    """Rank 0 refusing while the others wait for its plan would leave them hanging in the
    broadcast until the process group's timeout."""
    refusal = PreflightError("this job does not fit even at micro batch 1: ...")

    def refuse():
        raise refusal

    with pytest.raises(PreflightError) as on_rank_0:
        shared_plan.rank_0_answer(refuse)
    wire.rank = 1
    with pytest.raises(PreflightError) as on_rank_1:
        shared_plan.rank_0_answer(lambda: pytest.fail("rank 1 planned on its own"))
    assert str(on_rank_1.value) == str(on_rank_0.value)


def test_an_error_that_cannot_travel_reaches_the_other_ranks_as_its_message(wire):
    class Unpicklable(Exception):
        def __reduce__(self):
            raise TypeError("no")

    def fail():
        raise Unpicklable("the reason")

    with pytest.raises(Unpicklable):
        shared_plan.rank_0_answer(fail)
    wire.rank = 1
    with pytest.raises(RuntimeError, match="Unpicklable: the reason"):
        shared_plan.rank_0_answer(lambda: None)


@pytest.mark.parametrize(
    ("env", "started_outside"),
    [
        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2", "RANK": "1"}, True),  # torchrun
        ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "1", "RANK": "0"}, False),  # one process
        ({"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NAME": "t"}, True),  # srun
        ({"LOCAL_RANK": "1", "WORLD_SIZE": "2"}, False),  # Lightning's launcher: preflight.json
        ({}, False),
    ],
)
def test_only_ranks_that_torchrun_or_srun_started_wait_for_rank_0(
    env, started_outside, monkeypatch
):
    for key in LAUNCHERS:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert (shared_plan.ranks_started_outside() is not None) == started_outside


def test_without_torchrun_or_srun_each_process_plans_itself_and_starts_no_group(monkeypatch):
    for key in LAUNCHERS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(shared_plan, "join_process_group", lambda *a: pytest.fail("joined"))
    assert shared_plan.plan_on_rank_0(lambda: "own", "ddp", "cpu", None) == "own"


@pytest.mark.parametrize(
    ("strategy", "kind", "backend", "timeout"),
    [
        ("ddp", "cpu", "gloo", timedelta(minutes=30)),  # Lightning's defaults
        ("fsdp", "cuda", "nccl", timedelta(minutes=30)),
        (
            {
                "_target_": "lightning.pytorch.strategies.DDPStrategy",
                "process_group_backend": "gloo",
                "timeout": {"_target_": "datetime.timedelta", "minutes": 5},
            },
            "cuda",
            "gloo",
            timedelta(minutes=5),
        ),
    ],
)
def test_the_group_is_the_one_the_strategy_would_make(strategy, kind, backend, timeout):
    assert shared_plan.group_options(strategy, kind) == (backend, timeout)


def test_the_group_is_bound_to_this_rank_s_gpu_as_lightning_binds_it(monkeypatch):
    """Lightning passes ``device_id=root_device`` (pytorch/strategies/ddp.py:205-206): local rank
    1 of trainer.devices=[2,3] binds cuda:3."""
    asked = {}
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(
        torch.distributed, "init_process_group", lambda backend, **kw: asked.update(kw, b=backend)
    )
    monkeypatch.setattr("atexit.register", lambda f: None)
    monkeypatch.setenv("MASTER_ADDR", "")  # put back after the test
    monkeypatch.setenv("MASTER_PORT", "")
    environment = SimpleNamespace(
        main_address="node1", main_port=29500, global_rank=lambda: 1, world_size=lambda: 2
    )
    shared_plan.join_process_group(environment, "nccl", timedelta(minutes=30), 3)
    assert asked["device_id"] == torch.device("cuda", 3) and asked["b"] == "nccl"
    assert (asked["rank"], asked["world_size"]) == (1, 2)
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("node1", "29500")


# The tiny LoRA job with the batch chosen by the preflight; rank 0 has room, rank 1's GPU is busy
# (a budget under what the process itself holds: on its own it refuses to start).
PER_RANK_BUDGETS = [["hardware.memory_budget_gb=8"], ["hardware.memory_budget_gb=0.1"]]


@pytest.mark.slow  # ~40 s
def test_torchrun_ranks_with_different_free_memory_train_with_rank_0_s_plan(tmp_path):
    record = tmp_path / "record"
    args = [
        *TINY_LORA,
        "data.builder.modules=[json,csv,base64,shlex]",
        "data.vocab_size=512",
        "data.max_length=64",
        "data.batch_size=from_profile",
        "hardware.batch_size=auto",
        "preflight.max_batch_size=12",
        "trainer.max_steps=2",
        "trainer=ddp_cpu",
        "trainer.strategy=ddp",
        "+callbacks.plan._target_=tests.per_rank.RecordPlan",
        f"+callbacks.plan.folder={record}",
        "run_name=torchrun",
    ]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in LAUNCHERS and not key.startswith("SLURM_")
    }
    done = subprocess.run(
        [*torchrun, str(ROOT / "tests" / "per_rank.py"), str(TRAIN), *args],
        cwd=tmp_path,
        env={
            **env,
            "LAPTRAIN_CACHE": str(tmp_path / "cache"),
            "LAPTRAIN_RANK_OVERRIDES": json.dumps(PER_RANK_BUDGETS),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    folder = tmp_path / "outputs" / "torchrun"
    plan = json.loads((folder / "preflight.json").read_text())
    assert plan["budget"]["bytes"] == 8 * 1024**3  # rank 0's budget made the plan
    ranks = [json.loads((record / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1]
    assert ranks[0]["loader_batch"] == plan["micro_batch"] == 12
    assert ranks[0]["accumulation"] == plan["accumulation"]
    assert ranks[0]["checkpointing"] is plan["checkpointing"] is False
    assert "test/loss" in json.loads((folder / "metrics.json").read_text())
