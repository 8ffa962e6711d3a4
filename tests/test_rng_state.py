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
