"""logger=mlflow and logger=wandb with the real packages, offline: what reaches each tracker, one
tracking run per laptrain run across a resume, W&B offline unless a key is found (never a prompt),
and the one-line refusal without the extra. No test here touches the network (``no_network``)."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from laptrain.config import plugin_extras
from laptrain.config.check import ConfigError
from laptrain.config.plugin_extras import MissingExtra, check_config_extras, check_plugin_extras
from laptrain.loggers import continued_runs, tracking
from laptrain.run_folder.lock import LOCK_NAME, hold_run_folder, release_run_folder
from tests.conftest import CONF, TRAIN, compose_train, tiny_classifier_job
from tests.in_process import train_here
from tests.wandb_records import run_view

MLFLOW_MISSING = 'needs mlflow-skinny, from laptrain\'s [mlflow] extra, which is not installed: pip install -e ".[mlflow]"'
WANDB_MISSING = (
    'needs wandb, from laptrain\'s [wandb] extra, which is not installed: pip install -e ".[wandb]"'
)
# wandb's settings read from the environment: none may come from the machine running the suite
WANDB_VARS = ("WANDB_API_KEY", "WANDB_MODE", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL", "NETRC")


def _local(host: object) -> bool:
    if host in (None, "", "localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def no_network(monkeypatch):
    """Refuse, and record, any connection or name lookup off this machine while the test runs
    (loopback and Unix sockets stay allowed: wandb talks to its own wandb-core process)."""
    tried: list[object] = []
    connect, connect_ex, lookup = (
        socket.socket.connect,
        socket.socket.connect_ex,
        socket.getaddrinfo,
    )

    def guarded(real):
        def call(self, address):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _local(address[0]):
                tried.append(address)
                raise OSError(f"no network in this test: {address}")
            return real(self, address)

        return call

    def guarded_lookup(host, *args, **kwargs):
        if not _local(host):
            tried.append(host)
            raise socket.gaierror(f"no network in this test: {host}")
        return lookup(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", guarded(connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(connect_ex))
    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    yield tried
    assert tried == [], f"tried to reach {tried}"


def job(tmp_path: Path) -> list[str]:
    """The tiny classifier, validated (and checkpointed as best) every 2 steps, logging every step."""
    return [
        *tiny_classifier_job(tmp_path),
        "debug=fast",
        "trainer.max_epochs=2",  # debug=fast's 1 would end a rerun at once
        "trainer.val_check_interval=2",
    ]


def mlflow_runs(store: str) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store)
    experiment = client.get_experiment_by_name("laptrain")
    return client, client.search_runs([experiment.experiment_id])


def test_mlflow_beside_tensorboard_gets_params_metrics_and_best_checkpoint_and_a_resume_continues_its_run(
    tmp_path, monkeypatch, no_network
):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)  # the default store
    args = [*job(tmp_path), "logger=[tensorboard,mlflow]", "run_name=tracked"]
    first = train_here([*args, "trainer.max_steps=2"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "outputs" / "tracked"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))  # both loggers wrote
    store = f"sqlite:///{run}/mlflow.db"  # the default: a store in the run folder
    client, (only,) = mlflow_runs(store)
    kept = json.loads((run / continued_runs.TRACKING_FILE).read_text())["mlflow"]
    assert kept == {"run_id": only.info.run_id, "tracking_uri": store}
    params, metrics = only.data.params, only.data.metrics
    assert params["trainer/max_steps"] == "2" and params["seed"] == "42"  # the run's config
    assert params["model/backbone/hidden_size"] == "32"
    assert metrics["train/samples_per_s"] > 0 and metrics["run/throughput/samples_per_s"] > 0
    assert metrics["run/memory/peak_process_rss_mb"] > 0
    assert 0 <= metrics["val/acc"] <= 1 and "test/acc" in metrics
    best = Path(only.data.tags["best_checkpoint"])
    assert best.parent == run / "checkpoints" and best.is_file()
    assert not (tmp_path / "mlruns").exists()  # nothing in the working folder

    again = train_here([*args, "trainer.max_steps=4"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    client, (same,) = mlflow_runs(store)  # the same run, continued
    assert same.info.run_id == only.info.run_id and same.info.status == "FINISHED"
    # a parameter keeps its first value; the resume's is a tag
    assert same.data.params["trainer/max_steps"] == "2"
    assert same.data.tags["resumed/trainer/max_steps"] == "4"
    steps = {m.step for m in client.get_metric_history(same.info.run_id, "train/samples_per_s")}
    assert steps == {1, 2, 3, 4}

    client.delete_run(same.info.run_id)  # deleted in the UI: the next session starts a new run
    third = train_here([*args, "trainer.max_steps=6"], tmp_path)
    assert third.returncode == 0, third.stderr[-3000:]
    assert f"MLflow run {same.info.run_id} is not in {store}" in third.stderr
    client, (new,) = mlflow_runs(store)
    assert new.info.run_id != same.info.run_id and new.data.params["trainer/max_steps"] == "6"
    kept = json.loads((run / continued_runs.TRACKING_FILE).read_text())["mlflow"]
    assert kept["run_id"] == new.info.run_id


def test_wandb_logs_offline_without_a_key_and_a_resume_continues_its_run_id(
    tmp_path, monkeypatch, no_network
):
    for name in WANDB_VARS:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"  # no ~/.netrc: nobody logged in
    home.mkdir()
    args = [*job(tmp_path), "logger=wandb", "run_name=tracked"]
    first = train_here([*args, "trainer.max_steps=2"], tmp_path, env={"HOME": str(home)})
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "outputs" / "tracked"
    (log,) = (run / "wandb").glob("offline-run-*/run-*.wandb")
    view = run_view(log)
    kept = json.loads((run / continued_runs.TRACKING_FILE).read_text())["wandb"]
    assert kept == {"id": view["id"], "project": "laptrain"}
    assert view["config"]["trainer"]["max_steps"] == 2 and view["config"]["seed"] == 42
    assert any(row.get("train/samples_per_s", 0) > 0 for row in view["history"])
    summary = view["summary"]
    assert summary["run/memory/peak_process_rss_mb"] > 0
    assert summary["run/throughput/samples_per_s"] > 0
    best = Path(summary["best_checkpoint"])
    assert best.parent == run / "checkpoints" and best.is_file()

    again = train_here([*args, "trainer.max_steps=4"], tmp_path, env={"HOME": str(home)})
    assert again.returncode == 0, again.stderr[-3000:]
    logs = sorted(
        (run / "wandb").glob("offline-run-*/run-*.wandb"), key=lambda p: p.stat().st_mtime
    )
    assert len(logs) == 2  # one offline file per session, both of one W&B run
    views = [run_view(p) for p in logs]
    assert {v["id"] for v in views} == {kept["id"]}
    steps = {row.get("trainer/global_step") for row in views[1]["history"]}
    assert {3, 4} <= steps and views[1]["config"]["trainer"]["max_steps"] == 4


def test_each_job_of_a_sweep_gets_its_own_wandb_run(tmp_path, monkeypatch, no_network):
    """Hydra runs a sweep's jobs one after another in one process; WandbLogger would log every job
    after the first into the first job's run (it reuses ``wandb.run``) unless each job ends its own."""
    for name in WANDB_VARS:
        monkeypatch.delenv(name, raising=False)
    args = [*job(tmp_path), "logger=wandb", "run_name=swept", "trainer.max_steps=2", "test=false"]
    done = train_here(["-m", *args, "seed=1,2"], tmp_path, env={"HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = tmp_path / "outputs" / "multirun" / "swept"
    logs = sorted(sweep.glob("*/wandb/offline-run-*/run-*.wandb"))
    assert len(logs) == 2  # one per job folder
    views = [run_view(p) for p in logs]
    assert [f"seed={v['config']['seed']}," in p.parts[-4] for p, v in zip(logs, views)] == [
        True
    ] * 2
    assert len({v["id"] for v in views}) == 2


def test_wandb_is_offline_unless_a_key_is_found(tmp_path):
    home = tmp_path
    assert tracking.wandb_mode(None, {}, home) == "offline"
    assert tracking.wandb_mode(None, {"WANDB_API_KEY": "k" * 40}, home) == "online"
    (home / ".netrc").write_text(
        "machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n"
    )
    assert tracking.wandb_mode(None, {}, home) == "online"  # what `wandb login` writes
    # a self-hosted server's key is not api.wandb.ai's
    assert tracking.wandb_mode(None, {"WANDB_BASE_URL": "https://wandb.example.com"}, home) == (
        "offline"
    )


def test_a_mode_the_user_set_wins_and_online_without_a_key_is_refused_not_prompted(tmp_path):
    key = {"WANDB_API_KEY": "k" * 40}
    assert tracking.wandb_mode(None, {**key, "WANDB_MODE": "offline"}, tmp_path) == "offline"
    assert tracking.wandb_mode("disabled", {**key, "WANDB_MODE": "online"}, tmp_path) == "disabled"
    with pytest.raises(ConfigError) as err:
        tracking.wandb_mode(None, {"WANDB_MODE": "online"}, tmp_path)
    assert str(err.value) == (
        "WANDB_MODE=online asks for W&B online, but no W&B API key was found (WANDB_API_KEY, or "
        "`wandb login`); set one, or leave the mode unset to log offline"
    )
    with pytest.raises(ConfigError, match=r"^logger.wandb.mode=online asks"):
        tracking.wandb_mode("online", {}, tmp_path)


def test_the_built_section_passes_back_only_ids_of_the_same_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose_train(["logger=[tensorboard,mlflow,wandb]"], tmp_path)
    folder = Path(cfg.paths.output_dir)
    folder.mkdir(parents=True)
    own = f"sqlite:///{folder}/mlflow.db"
    kept = {"mlflow": {"run_id": "abc", "tracking_uri": own}, "wandb": {"id": "w1"}}
    (folder / continued_runs.TRACKING_FILE).write_text(json.dumps(kept))
    built = tracking.prepared(cfg.logger, folder, {})
    assert built.mlflow.run_id == "abc" and built.mlflow.tracking_uri == own
    assert built.mlflow.artifact_location == str(folder / "mlflow-artifacts")
    assert built.wandb.id == "w1" and built.wandb.mode == "offline"
    assert built.tensorboard.save_dir == str(folder)
    # a resume pointed at another store starts a new run there
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    other = tracking.prepared(cfg.logger, folder, {})
    assert other.mlflow.tracking_uri == "http://127.0.0.1:5000"
    assert other.mlflow.run_id is None and other.mlflow.artifact_location is None


@pytest.mark.parametrize(
    ("override", "missing"),
    [
        ("logger=mlflow", MLFLOW_MISSING),
        ("logger=wandb", WANDB_MISSING),
        ("logger=[tensorboard,mlflow]", MLFLOW_MISSING),
        ("+logger=wandb", WANDB_MISSING),
        ("logger=tensorboard,wandb", WANDB_MISSING),  # a -m sweep over loggers
    ],
)
def test_a_tracker_without_its_extra_names_the_extra(override, missing):
    with pytest.raises(MissingExtra) as err:
        check_plugin_extras(["model=tiny_classifier", override], CONF, is_installed=lambda m: False)
    assert str(err.value) == f"{override} {missing}"
    check_plugin_extras([override], CONF, is_installed=lambda m: True)


def test_a_tracker_chosen_in_a_file_is_checked_in_the_composed_config():
    cfg = compose_train(["logger=[tensorboard,wandb]"])  # as if a preset or conf/local chose it
    with pytest.raises(MissingExtra) as err:
        check_config_extras(cfg, is_installed=lambda m: m != "wandb")
    assert str(err.value) == f"logger.wandb {WANDB_MISSING}"
    check_config_extras(cfg, is_installed=lambda m: m != "mlflow")


def test_train_py_without_the_mlflow_extra_says_which_extra_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(plugin_extras, "installed", lambda module: module != "mlflow")
    done = train_here([*tiny_classifier_job(tmp_path), "logger=[tensorboard,mlflow]"], tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        f"error: logger=[tensorboard,mlflow] {MLFLOW_MISSING}"
    ]
    assert not (tmp_path / "outputs").exists()  # refused before anything is written


def test_train_py_with_wandb_online_and_no_key_refuses_in_one_line_before_writing(
    tmp_path, monkeypatch
):
    for name in WANDB_VARS:
        monkeypatch.delenv(name, raising=False)
    env = {"HOME": str(tmp_path), "WANDB_MODE": "online"}
    done = train_here([*tiny_classifier_job(tmp_path), "logger=wandb"], tmp_path, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().splitlines() == [
        "error: WANDB_MODE=online asks for W&B online, but no W&B API key was found "
        "(WANDB_API_KEY, or `wandb login`); set one, or leave the mode unset to log offline"
    ]
    assert not (tmp_path / "outputs").exists()


def test_a_rank_other_than_global_rank_0_builds_no_tracking_logger(tmp_path):
    """The rule behind the torchrun test below: MLflow and W&B only where ``tracked``; every
    rank opening a fresh SQLite store at once raced its migrations (issue 48, item 11)."""
    section = OmegaConf.create(
        {
            "tensorboard": {
                "_target_": "lightning.pytorch.loggers.TensorBoardLogger",
                "save_dir": "tb",
            },
            "mlflow": {
                "_target_": "laptrain.loggers.mlflow_logger.MLFlowLogger",
                "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            },
        }
    )
    assert set(tracking.prepared(section, tmp_path, environ={}, tracked=True)) == {
        "tensorboard",
        "mlflow",
    }
    assert set(tracking.prepared(section, tmp_path, environ={}, tracked=False)) == {"tensorboard"}
    assert not (tmp_path / "mlflow.db").exists()


@pytest.mark.slow  # 28 s of torchrun; its fast twin: the rank rule just above
def test_torchrun_with_mlflow_on_a_fresh_folder_trains_and_logs_one_run(tmp_path, monkeypatch):
    """torchrun starts both ranks at once; each one opening the new SQLite store ran MLflow's
    migrations twice at the same time (``OperationalError``): one rank died, the other waited for
    it. Only rank 0 builds the tracking loggers."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = [
        *job(tmp_path),
        "trainer.max_steps=2",
        "test=false",
        "trainer=ddp_cpu",
        "trainer.strategy=ddp",
        "logger=mlflow",
        "run_name=ranks",
    ]
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*launcher, str(TRAIN), *args],
        cwd=tmp_path,
        env={**os.environ, "LAPTRAIN_CACHE": str(tmp_path / "cache")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    run = tmp_path / "outputs" / "ranks"
    _, (only,) = mlflow_runs(f"sqlite:///{run}/mlflow.db")
    assert only.data.params["trainer/max_steps"] == "2" and only.data.metrics["val/acc"] >= 0


def test_credentials_in_the_config_reach_no_tracker_and_no_file_laptrain_writes(
    tmp_path, monkeypatch, no_network
):
    """A token given as an option and a URI with its login were copied whole into TensorBoard's
    and CSV's hparams.yaml, MLflow's params, the run report's resume command and the lock file."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = [
        *job(tmp_path),
        "trainer.max_steps=2",
        "logger=[tensorboard,csv,mlflow]",
        "run_name=secret",
        "+hub.hf_token=hf_SeCrEt1",
        "+hub.mirror=https://me:hunter2@hub.example.com/models",
        "+hub.pad_token=PAD",  # a token of the vocabulary, no credential
    ]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "outputs" / "secret"
    written = [p for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts]
    leaks = [p for p in written if b"hf_SeCrEt1" in p.read_bytes() or b"hunter2" in p.read_bytes()]
    assert leaks == []  # mlflow.db included; only Hydra's own .hydra/ keeps the command
    (board,) = run.glob("tensorboard/**/hparams.yaml")
    assert (
        "hf_token: '***'" in board.read_text()
        and "https://***@hub.example.com" in board.read_text()
    )
    _, (only,) = mlflow_runs(f"sqlite:///{run}/mlflow.db")
    assert only.data.params["hub/hf_token"] == "***"
    assert only.data.params["hub/pad_token"] == "PAD"
    report = json.loads((run / "report.json").read_text())
    assert "+hub.hf_token=***" in report["checkpoint"]["resume"]
    held = tmp_path / "held"
    hold_run_folder(held, ["train.py", "+hub.hf_token=hf_SeCrEt1"])
    try:
        assert json.loads((held / LOCK_NAME).read_text())["command"] == "train.py +hub.hf_token=***"
    finally:
        release_run_folder(held)


def test_a_tracking_uri_with_a_login_is_kept_without_it_and_still_continues_its_run(tmp_path):
    class Run:
        run_id = "abc"

    uri = "https://me:hunter2@mlflow.example.com"
    section = compose_train(["logger=mlflow", f"logger.mlflow.tracking_uri={uri}"]).logger
    continued_runs.remember(section, [Run()], tmp_path)
    kept = json.loads((tmp_path / continued_runs.TRACKING_FILE).read_text())["mlflow"]
    assert kept == {"run_id": "abc", "tracking_uri": "https://***@mlflow.example.com"}
    continued_runs.with_stored_ids(section, tmp_path)
    assert section.mlflow.run_id == "abc"
