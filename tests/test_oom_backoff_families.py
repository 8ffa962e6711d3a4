"""OOM backoff on the real families through train.py (tests/test_oom_backoff.py covers the
mechanism on a BoringModel): an out-of-memory error in step 2 halves the micro batch, the run
says so once, finishes, and ends where the same run without the error ends."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import NO_DROPOUT, TINY_LORA, tiny_classifier_job
from tests.in_process import train_here
from tests.test_scale_out_runs import final_weights

OOM = ["+callbacks.oom._target_=tests.oom_at.OutOfMemoryAbove", "+callbacks.oom.step=2"]


def classifier(tmp_path: Path) -> list[str]:
    return [
        *tiny_classifier_job(tmp_path),
        *NO_DROPOUT,
        "hardware.batch_size=16",
        "trainer.max_steps=4",
        "test=false",
    ]


def lora(tmp_path: Path) -> list[str]:
    return [
        *TINY_LORA,
        "model.lora.dropout=0",
        "data.builder.modules=[json,csv,base64,shlex]",
        "data.vocab_size=512",
        "data.max_length=64",
        "data.batch_size=8",
        "trainer.max_steps=4",
        "test=false",
    ]


@pytest.mark.parametrize(("family", "micro"), [(classifier, 16), (lora, 8)])
def test_an_oom_in_step_2_halves_the_micro_batch_and_changes_nothing_else(tmp_path, family, micro):
    args = family(tmp_path)
    whole = train_here([*args, "run_name=whole"], tmp_path)
    assert whole.returncode == 0, whole.stderr[-3000:]
    hit = train_here([*args, "run_name=hit", *OOM, f"+callbacks.oom.fits={micro // 2}"], tmp_path)
    assert hit.returncode == 0, hit.stderr[-3000:]
    said = (
        f"oom_backoff: out of memory in step 2 with micro-batch {micro}; retrying with {micro // 2}"
    )
    assert (hit.stdout + hit.stderr).count(said) == 1, (hit.stdout + hit.stderr)[-3000:]
    assert "done at global step 4" in hit.stdout
    report = json.loads((tmp_path / "outputs" / "hit" / "report.json").read_text())
    assert [(e["step"], e["from"], e["to"]) for e in report["oom"]["events"]] == [
        (2, micro, micro // 2)
    ]
    a, b = final_weights(tmp_path, "whole"), final_weights(tmp_path, "hit")
    assert a.keys() == b.keys()
    for name in a:  # the same samples, the same effective batch: only summation order differs
        assert torch.allclose(a[name], b[name], rtol=1e-4, atol=1e-6), name
