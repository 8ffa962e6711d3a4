"""Bad input around a user's own module gets one line, exit code 2, and no checkpoint (issue 35,
"Bad input gets one line, exit 2, nothing written")."""

from __future__ import annotations

import importlib
from pathlib import Path
from subprocess import CompletedProcess

import pytest

from laptrain.callbacks.monitored_metric import MonitoredMetricCheck
from laptrain.config.check import TargetNotFound, _locate, _role_problem
from laptrain.job import run
from tests.conftest import quiet_trainer
from tests.in_process import train_here
from tests.user_style import FAST, user_args, user_env, write_user_project


@pytest.fixture
def project(tmp_path) -> Path:
    return write_user_project(tmp_path / "project")


def train_user(args: list[str], cwd: Path, project: Path, monkeypatch) -> CompletedProcess:
    """``python train.py <args>`` with ``user_env(project)``, run in this process: a process puts
    that PYTHONPATH on sys.path when it starts, so here ``project`` goes first on it for the run,
    and no ``mytask`` of an earlier test is left imported."""
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(importlib.sys.modules, "mytask", raising=False)
    return train_here(args, cwd, env=user_env(project))


def refused(done) -> str:
    """The one ``error:`` line of a refused run (exit code 2, no traceback)."""
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), done.stderr[-3000:]
    return errors[0]


def checkpoints(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.ckpt")) + sorted(folder.rglob("metrics.json"))


def test_a_target_that_does_not_import_names_the_missing_part_and_the_folder(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(importlib.sys.modules, "mytask", raising=False)
    with pytest.raises(
        TargetNotFound,
        match=r"^there is no module mytaskk on the import path: put "
        r"your code in the user/ folder beside train.py \(e.g. user/mytaskk.py, "
        r"named _target_: user.mytaskk.MLPModule",
    ):
        _locate("mytaskk.MLPModule")
    with pytest.raises(
        TargetNotFound,
        match=r"mytask \(.*mytask.py\) has no MLPModul \(did you "
        r"mean MLPModule\?\)$",
    ):
        _locate("mytask.MLPModul")
    (project / "broken.py").write_text("import not_installed_anywhere\n")
    with pytest.raises(
        TargetNotFound,
        match="importing broken failed \\(ModuleNotFoundError: No "
        "module named 'not_installed_anywhere'\\)",
    ):
        _locate("broken.Module")
    assert _locate("torch.nn.Linear").__name__ == "Linear"


def test_a_class_of_the_wrong_kind_is_named_with_what_it_is(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delitem(importlib.sys.modules, "mytask", raising=False)
    mytask = importlib.import_module("mytask")
    assert _role_problem(mytask.BlobsDataModule, "mytask.BlobsDataModule", "model") == (
        "model._target_=mytask.BlobsDataModule is a LightningDataModule: point model._target_ at "
        "a class that subclasses lightning.pytorch.LightningModule (docs/your_model.md)"
    )
    assert "is not a LightningDataModule (its bases: torch.nn.modules.module.Module)" in (
        _role_problem(mytask.NotAModule, "mytask.NotAModule", "data")
    )
    assert _role_problem(mytask.MLPModule, "mytask.MLPModule", "model") is None
    assert _role_problem(mytask.NotAModule, "mytask.NotAModule", "callbacks.x") is None


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "model._target_=mytaskk.MLPModule",
            "error: model._target_=mytaskk.MLPModule cannot be imported: there is no module "
            "mytaskk on the import path: put your code in the user/ folder beside train.py",
        ),
        pytest.param(
            "model._target_=mytask.BlobsDataModule",
            "error: model._target_=mytask.BlobsDataModule is a LightningDataModule: point "
            "model._target_ at a class that subclasses lightning.pytorch.LightningModule",
            marks=pytest.mark.slow,  # the same refusal path as the case above, another message
        ),
    ],
)
def test_train_py_refuses_a_bad_target_in_one_line_before_any_folder(
    tmp_path, project, monkeypatch, override, expected
):
    """Before: a three-line ImportError text, or 'model.hidden is not an argument of
    mytask.BlobsDataModule' for a datamodule named as the model."""
    done = train_user(
        ["model=mlp", "data=blobs", *FAST, override, *user_args(project)],
        tmp_path,
        project,
        monkeypatch,
    )
    assert refused(done).startswith(expected)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.slow  # ~6 s; test_user_batch checks the same refusal in process
def test_train_py_tells_a_datamodule_without_a_batch_size_which_attribute_to_add(
    tmp_path, project, monkeypatch
):
    """Before: AttributeError 'FixedBatchDataModule' object has no attribute 'with_batch_sizes'."""
    done = train_user(
        [
            "model=mlp",
            "data=fixed_batch",
            *FAST,
            "+data.batch_size=from_profile",
            *user_args(project),
        ],
        tmp_path,
        project,
        monkeypatch,
    )
    line = refused(done)
    assert line.startswith(
        "error: data.batch_size=from_profile: FixedBatchDataModule has no batch size to set"
    )
    assert "self.save_hyperparameters()" in line and "batch_size=self.hparams.batch_size" in line
    assert not checkpoints(tmp_path / "outputs")


def test_train_py_stops_at_the_first_validation_when_the_monitored_metric_is_not_logged(
    tmp_path, project, monkeypatch
):
    """Before: Lightning's MisconfigurationException traceback from ModelCheckpoint."""
    done = train_user(
        ["model=mlp", "data=blobs", *FAST, "+model.stage_name=valid", *user_args(project)],
        tmp_path,
        project,
        monkeypatch,
    )
    line = [x for x in done.stderr.splitlines() if x.startswith("error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert line == [
        "error: the checkpoints rank by val/acc, which MLPModule does not log (it logs: "
        "train/acc, train/loss, valid/acc, valid/loss): log it in validation_step with "
        "self.log('val/acc', value), or name a logged one in conf/model/mlp.yaml as _metric_: "
        "{name: valid/acc, mode: max} (on the command line: +model._metric_.name=valid/acc "
        "+model._metric_.mode=max)"
    ]
    assert not checkpoints(tmp_path / "outputs")  # stopped before ModelCheckpoint saved
    # a first run: its folder (logs, run_info, TensorBoard events) goes too; nothing is written
    assert not [p for p in (tmp_path / "outputs").iterdir() if p.name != "multirun"]


def test_the_metric_check_passes_a_module_that_logs_the_monitored_metric(tmp_path, project):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel

    class Logs(BoringModel):
        def validation_step(self, batch, batch_idx):
            out = super().validation_step(batch, batch_idx)
            self.log("val/acc", 1.0)
            return out

    check = MonitoredMetricCheck("boring")
    trainer = quiet_trainer(
        max_steps=2,
        limit_val_batches=1,
        val_check_interval=1,
        enable_checkpointing=True,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, monitor="val/acc", mode="max"), check],
        default_root_dir=tmp_path,
    )
    trainer.fit(Logs())
    assert check.checked and trainer.global_step == 2


def test_a_user_target_run_from_outside_the_clone_says_where_to_run_it(monkeypatch):
    """A preset written by ``laptrain new`` (``user.<task>...``) read where ``user/`` is not on the
    import path: the message told the user to put the code in user/ and name it user.user...."""
    monkeypatch.delitem(importlib.sys.modules, "user", raising=False)
    monkeypatch.setattr(
        importlib.sys, "path", [p for p in importlib.sys.path if p not in ("", ".")]
    )
    with pytest.raises(TargetNotFound, match=r"^there is no user package on the import path: run "):
        _locate("user.my_task.model.MyTaskModule")


def test_a_module_s_own_fused_adamw_is_refused_where_fused_trains_wrongly(
    tmp_path, project, monkeypatch
):
    """``trainer=fsdp`` at 16-mixed on GPUs, stood in for on this CPU: a config key cannot reach
    the optimizer a module builds itself, and its ``AdamW(fused=True)`` let the ranks' loss scales
    drift apart with no error. The optimizer the module built is what is checked."""
    mytask = project / "mytask.py"
    mytask.write_text(
        mytask.read_text().replace(
            "torch.optim.Adam(self.parameters(), lr=self.hparams.lr)",
            "torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, fused=True)",
        )
    )
    monkeypatch.setattr(run, "fused_optimizer_unsafe", lambda kind, precision, sharded: True)
    args = [*user_args(project), *FAST, "model=mlp", "data=blobs"]
    line = refused(train_user(args, tmp_path, project, monkeypatch))
    assert line == (
        "error: MLPModule.configure_optimizers builds AdamW(fused=True) with 16-mixed under FSDP: "
        "Lightning leaves a fused optimizer's unscale to its kernel, so the ranks never share an "
        "overflow and their loss scales drift apart (docs/hardware.md §3): build it with "
        "fused=False"
    )
    assert not checkpoints(tmp_path / "outputs")
    assert not [p for p in (tmp_path / "outputs").iterdir() if p.name != "multirun"]
