"""Device harness: every model family trains, saves and resumes while Lightning converts the module
after the callbacks' ``setup``, and everything a module or callback keeps must follow it.

``precision="64-true"`` is the CPU stand-in for a device move: Lightning 2.6.6 converts the module
in ``strategy.setup`` (``precision_plugin.convert_module``, then ``model_to_device``), after
``Callback.setup`` and the checkpoint restore (``Trainer._run``), exactly where an MPS or CUDA run
moves it. A float32 EMA shadow, carry or buffer left behind is the CPU twin of a tensor left on the
CPU, which crashes the first op on a GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from smoke_harness.builds import SMOKE_BUILDS
from smoke_harness.cells import smoke_fit
from smoke_harness.placement import PlacementCheck, placement_errors

from laptrain.families.trm.ema import EMA


@pytest.mark.parametrize("name", sorted(SMOKE_BUILDS))
def test_kept_tensors_follow_a_conversion_after_setup(name: str, tmp_path: Path) -> None:
    result = smoke_fit(SMOKE_BUILDS[name], "64-true", "cpu", steps=2, workdir=tmp_path)
    # start, 2 batches, end; for the first fit and the resumed one
    assert result["placement_checks"] == 8
    assert result["predictions"] > 0


def test_the_check_names_a_tensor_left_behind() -> None:
    module = torch.nn.Linear(2, 2).double()
    module.register_buffer("stale", torch.zeros(2))
    ema = EMA()
    ema.shadow = {"weight": torch.zeros(2, 2)}
    errors = placement_errors(module, [ema])
    assert any("buffer stale: torch.float32" in e for e in errors)
    assert any(
        "EMA.shadow['weight']: torch.float32, its parameter wants torch.float64" in e
        for e in errors
    )
    assert placement_errors(torch.nn.Linear(2, 2).double(), [PlacementCheck()]) == []
