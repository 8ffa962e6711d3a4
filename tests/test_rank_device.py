"""Each rank's own GPU is ``trainer.devices[local rank]`` (issue 36, item 6 and the verify item).

Lightning trains local rank r on ``parallel_devices[r]``; with ``trainer.devices=[2,3]`` that is
GPU 2 and GPU 3. The memory probe, ``base_dtype: auto``, the preflight (and its ``verify`` steps)
and a 4-bit base's ``device_map`` read GPU ``local_rank`` (0 and 1) instead, and left a CUDA
context on GPU 0. No GPU here: torch.cuda is stood in for, and the tests check which device each
piece asks for.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from laptrain.config.check import ConfigError
from laptrain.families.lora import causal_lm
from laptrain.hardware.probe import TorchProbe
from laptrain.job import plan as plan_module
from laptrain.job import run
from laptrain.launch import device
from laptrain.launch.device import RunDevice
from laptrain.preflight import batch, planner
from laptrain.ranks.environment import local_rank
from laptrain.ranks.processes import rank_cuda_index
from tests.conftest import TINY, compose_train, write_texts
from tests.fakes import FakeProbe


def test_the_local_rank_comes_from_the_launcher_torchrun_or_srun():
    assert local_rank({}) == 0  # one process, or rank 0 before Lightning starts the others
    assert local_rank({"LOCAL_RANK": "1"}) == 1  # Lightning's launcher, torchrun
    assert local_rank({"SLURM_LOCALID": "3"}) == 3  # srun
    assert local_rank({"LOCAL_RANK": "2", "SLURM_LOCALID": "0"}) == 2


@pytest.mark.parametrize(
    ("devices", "gpus"),
    [
        (2, [0, 1]),  # a count: GPUs 0..n-1
        ("2", [0, 1]),
        ([2, 3], [2, 3]),  # a list names the GPUs
        ("2,3", [2, 3]),
        ("3,", [3]),  # one GPU named by a comma string (device_parser.py:106-113)
        ([3, 1], [3, 1]),  # in the order written
        ("auto", [0, 1]),  # every visible GPU, in order
        (-1, [0, 1]),
        ("-1", [0, 1]),
    ],
)
def test_each_rank_trains_on_the_gpu_trainer_devices_gives_it(devices, gpus):
    for rank, gpu in enumerate(gpus):
        assert rank_cuda_index(devices, {"LOCAL_RANK": str(rank)}) == gpu
        assert rank_cuda_index(devices, {"SLURM_LOCALID": str(rank)}) == gpu


def test_a_list_with_too_few_gpus_for_this_rank_is_refused_in_one_line():
    with pytest.raises(ConfigError) as err:
        rank_cuda_index([2, 3], {"LOCAL_RANK": "2"})
    assert "\n" not in str(err.value)
    assert "trainer.devices=[2,3] names 2 GPU(s)" in str(err.value)
    assert "local rank 2" in str(err.value)


class StandInCuda:
    """torch.cuda on a machine with 4 GPUs: GPU 0 pre-Ampere, the others Ampere. Records which
    device each call asks for; ``current`` is the current device (GPU 0 until set)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.current = 0
        self.asked: list[tuple[str, int | None]] = []
        self.set: list[int] = []
        cuda = torch.cuda

        def record(name, value):
            def call(device=None, *args, **kwargs):
                self.asked.append((name, device))
                return value

            return call

        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "set_device", self._set_device)
        monkeypatch.setattr(cuda, "memory_allocated", record("allocated", 1))
        monkeypatch.setattr(cuda, "memory_reserved", record("reserved", 2))
        monkeypatch.setattr(cuda, "max_memory_allocated", record("peak", 3))
        monkeypatch.setattr(cuda, "mem_get_info", record("free", (5, 80)))
        monkeypatch.setattr(cuda, "synchronize", record("synchronize", None))
        monkeypatch.setattr(cuda, "reset_peak_memory_stats", record("reset_peak", None))
        monkeypatch.setattr(cuda, "get_device_properties", self._properties)
        monkeypatch.setattr(torch.version, "hip", None)

    def _set_device(self, index: int) -> None:
        self.set.append(index)
        self.current = index

    def _properties(self, device=None):
        self.asked.append(("properties", device))
        return types.SimpleNamespace(major=7 if device == 0 else 8, total_memory=80)


def test_the_probe_of_gpu_3_reads_gpu_3_and_never_the_current_device(monkeypatch):
    """bf16 was read from the current device (GPU 0, pre-Ampere here): False for an Ampere GPU."""
    cuda = StandInCuda(monkeypatch)
    probe = TorchProbe("cuda", 3)
    reading = probe.memory()
    probe.synchronize()
    probe.reset_peak()
    assert probe.bf16_supported()
    assert (reading.device_free, reading.device_limit) == (5, 80)
    assert {device for _, device in cuda.asked} == {3}


def test_a_probe_without_an_index_reads_the_current_device(monkeypatch):
    cuda = StandInCuda(monkeypatch)
    cuda.current = 2
    TorchProbe("cuda").memory()
    assert {device for _, device in cuda.asked} == {2}


@pytest.mark.parametrize(
    ("devices", "env", "gpu"),
    [("[2,3]", {"LOCAL_RANK": "1"}, 3), ("[2,3]", {}, 2), ("'1,3'", {"SLURM_LOCALID": "1"}, 3)],
)
def test_a_rank_pins_its_own_gpu_before_it_reads_or_builds_anything(
    tmp_path, monkeypatch, devices, env, gpu
):
    """The base_dtype probe reads trainer.devices[local rank], and that GPU is the current device
    before any CUDA call: nothing reads, allocates on or opens a context on GPU 0."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cuda = StandInCuda(monkeypatch)
    made = []

    class Probe(run.TorchProbe):  # records what it is asked for, reads this CPU machine
        def __init__(self, kind: str, index: int | None = None) -> None:
            made.append((kind, index, list(cuda.set)))
            super().__init__("cpu")

    monkeypatch.setattr(device, "check_device", lambda cfg, say: "32-true")
    monkeypatch.setattr(run, "TorchProbe", Probe)
    data = write_texts(tmp_path / "texts.csv", rows=60)
    overrides = ["hardware=cuda", "preflight.enabled=false", "data=text_csv", *TINY]
    overrides += [f"trainer.devices={devices}", f"data.files.train={data}"]
    run.build(compose_train(overrides, tmp_path), None, tmp_path)
    assert cuda.set == [gpu]
    assert made[0] == ("cuda", gpu, [gpu])  # pinned before the probe was made


def test_the_preflight_probes_this_rank_s_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    made = []

    class Stop(Exception):
        pass

    def probe(kind, index=None):
        made.append((kind, index))
        raise Stop

    monkeypatch.setattr(batch, "TorchProbe", probe)
    overrides = ["hardware=cuda", "hardware.batch_size=8", "trainer.devices=[2,3]"]
    cfg = compose_train(overrides, tmp_path)
    data = types.SimpleNamespace(max_length=16, num_workers=0)
    with pytest.raises(Stop):
        index = device.rank_device_index(cfg, "cuda")  # the launch's RunDevice.index
        plan_module.build_run_plan(
            cfg,
            object(),
            data,
            RunDevice("cuda", "32-true", index, ()),
            preflight=planner.estimated,
        )
    assert made == [("cuda", 3)]


def test_verify_runs_its_two_steps_on_the_probe_s_gpu():
    """preflight.verify moved the model to ``"cuda"``, the current device, not the probe's."""
    moved = []

    class Model(nn.Linear):
        def to(self, *args, **kwargs):
            moved.append(args[0])
            return self

    model = Model(4, 1)
    probe = FakeProbe(kind="cuda", index=3)
    batch.measure_peak(
        model,
        2,
        4,
        probe,
        "32-true",
        lambda n, length: torch.ones(n, 4),
        lambda m, x: m(x).sum(),
    )
    assert moved == [torch.device("cuda", 3)]


def test_a_4bit_base_loads_onto_the_rank_s_pinned_gpu(monkeypatch):
    """transformers puts a quantized base on the device it is given: the GPU the run pinned for
    this rank (GPU 3 for local rank 1 of trainer.devices=[2,3]), not cuda:LOCAL_RANK."""
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    asked: dict = {}
    monkeypatch.setattr(
        causal_lm, "load_pretrained_model", lambda load, source, fix: asked.update(load.keywords)
    )
    causal_lm.load_base("org/base", None, torch.bfloat16, quantization="4bit")
    assert asked["device_map"] == {"": 3}
