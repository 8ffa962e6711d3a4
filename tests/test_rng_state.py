"""RNGState: every generator a resumed run draws from comes back as it was saved."""

from __future__ import annotations

import random

import numpy as np
import torch

from laptrain.callbacks.rng_state import RNGState


def test_python_numpy_and_torch_cpu_draws_repeat_after_a_round_trip():
    callback = RNGState()
    state = callback.state_dict()
    first = (random.random(), np.random.rand(), torch.rand(3))
    callback.load_state_dict(state)
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[0] == again[0] and first[1] == again[1]
    assert torch.equal(first[2], again[2])


def test_the_mps_generator_is_saved_and_restored(monkeypatch):
    """A Mac stand-in: torch.mps's generator is a separate CPU generator here. Without the MPS
    entry, dropout on a resumed Mac run would draw different masks than the uninterrupted run."""
    mps_generator = torch.Generator().manual_seed(7)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "get_rng_state", lambda: mps_generator.get_state())
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda s: mps_generator.set_state(s))
    callback = RNGState()
    state = callback.state_dict()
    assert "mps" in state
    first = torch.rand(4, generator=mps_generator)
    callback.load_state_dict(state)
    assert torch.equal(torch.rand(4, generator=mps_generator), first)


def test_a_checkpoint_from_a_machine_without_mps_loads_on_one_with_it(monkeypatch):
    state = RNGState().state_dict()  # saved here: no MPS entry
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.mps, "set_rng_state", lambda s: (_ for _ in ()).throw(AssertionError))
    RNGState().load_state_dict(state)


class _StandInCuda:
    """torch.cuda's generator functions over ``count`` visible devices, each a CPU generator,
    indexed as torch/cuda/random.py indexes ``default_generators``: a device past the list raises
    IndexError, as on a GPU box."""

    def __init__(self, monkeypatch, count: int, current: int) -> None:
        self.generators = [torch.Generator().manual_seed(100 + i) for i in range(count)]
        self.current = current
        cuda = torch.cuda
        monkeypatch.setattr(cuda, "is_available", lambda: True)
        monkeypatch.setattr(cuda, "device_count", lambda: len(self.generators))
        monkeypatch.setattr(cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(cuda, "get_rng_state_all", self.get_rng_state_all)
        monkeypatch.setattr(cuda, "set_rng_state", self.set_rng_state)
        monkeypatch.setattr(cuda, "set_rng_state_all", self.set_rng_state_all)

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [g.get_state() for g in self.generators]

    def set_rng_state(self, state: torch.Tensor, device: int | str = "cuda") -> None:
        self.generators[self.current if device == "cuda" else device].set_state(state)

    def set_rng_state_all(self, states) -> None:
        for index, state in enumerate(states):
            self.set_rng_state(state, index)

    def draw(self, device: int) -> torch.Tensor:
        return torch.rand(4, generator=self.generators[device])


def test_a_resume_on_fewer_gpus_gives_this_process_its_own_devices_generator(monkeypatch):
    """Saved by the process on GPU 1 of 2, resumed with CUDA_VISIBLE_DEVICES=1 (one device,
    index 0): that device draws what GPU 1 would have drawn, instead of an IndexError."""
    saving = _StandInCuda(monkeypatch, count=2, current=1)
    state = RNGState().state_dict()
    expected = saving.draw(1)
    resumed = _StandInCuda(monkeypatch, count=1, current=0)
    RNGState().load_state_dict(state)
    assert torch.equal(resumed.draw(0), expected)


def test_a_resume_on_the_same_gpus_restores_every_device(monkeypatch):
    gpus = _StandInCuda(monkeypatch, count=2, current=0)
    state = RNGState().state_dict()
    expected = [gpus.draw(0), gpus.draw(1)]
    RNGState().load_state_dict(state)
    assert all(torch.equal(gpus.draw(i), expected[i]) for i in range(2))


def test_an_older_checkpoint_without_its_device_resumes_on_fewer_gpus(monkeypatch):
    _StandInCuda(monkeypatch, count=3, current=0)
    state = RNGState().state_dict()
    state.pop("cuda_device", None)
    expected = torch.rand(4, generator=torch.Generator().set_state(state["cuda"][0]))
    resumed = _StandInCuda(monkeypatch, count=1, current=0)
    RNGState().load_state_dict(state)
    assert torch.equal(resumed.draw(0), expected)
