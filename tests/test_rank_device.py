"""Each rank's own GPU: a 4-bit base loads onto cuda:LOCAL_RANK, not onto GPU 0 on every rank."""

from __future__ import annotations

import pytest
import torch

from laptrain.config.scale_out import local_rank
from laptrain.model.lora import causal_lm


def test_the_local_rank_comes_from_the_launcher_torchrun_or_srun():
    assert local_rank({}) == 0  # one process, or rank 0 before Lightning starts the others
    assert local_rank({"LOCAL_RANK": "1"}) == 1  # Lightning's launcher, torchrun
    assert local_rank({"SLURM_LOCALID": "3"}) == 3  # srun
    assert local_rank({"LOCAL_RANK": "2", "SLURM_LOCALID": "0"}) == 2


@pytest.mark.parametrize(
    ("env", "gpu"), [({}, 0), ({"LOCAL_RANK": "1"}, 1), ({"SLURM_LOCALID": "3"}, 3)]
)
def test_a_4bit_base_loads_onto_the_rank_s_own_gpu(env, gpu, monkeypatch):
    """transformers puts a quantized base given no device_map on the current CUDA device, GPU 0
    until Lightning sets each rank's, which is after the model is built."""
    for key in ("LOCAL_RANK", "SLURM_LOCALID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    asked: dict = {}
    monkeypatch.setattr(
        causal_lm, "load_pretrained_model", lambda load, source, fix: asked.update(load.keywords)
    )
    causal_lm.load_base("org/base", None, torch.bfloat16, quantization="4bit")
    assert asked["device_map"] == {"": gpu}
