"""A sweep over a user's own module (issue 35, item 8): `-m model.lr=...` on a lightning-hydra-
template project runs one job per value, each in its own folder with its checkpoints, and the
values reach the user's module."""

from __future__ import annotations

import torch

from tests.test_user_errors import train_user
from tests.user_style import FAST, user_args, write_user_project


def test_a_sweep_over_a_user_modules_learning_rate_runs_each_job(tmp_path, monkeypatch):
    project = write_user_project(tmp_path / "project")
    args = ["-m", "model=mlp", "data=blobs", *FAST, "run_name=lr", "model.lr=0.01,0.05"]
    done = train_user([*args, *user_args(project)], tmp_path, project, monkeypatch)
    assert done.returncode == 0, done.stderr[-3000:]
    jobs = sorted(p for p in (tmp_path / "outputs" / "multirun" / "lr").iterdir() if p.is_dir())
    assert len(jobs) == 2 and "model.lr=0.01" in jobs[0].name and "model.lr=0.05" in jobs[1].name
    for job, lr in zip(jobs, (0.01, 0.05)):
        last = torch.load(job / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
        assert last["hyper_parameters"]["lr"] == lr
        assert last["global_step"] == 8  # 240 train rows at the preset's batch 32, one epoch
        assert list((job / "checkpoints").glob("best-step*.ckpt"))
