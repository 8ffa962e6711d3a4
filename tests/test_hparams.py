"""laptrain.job.hparams: a run returns its best validation value (again when a finished run is rerun)
and leaves an HPARAMS row with hp/ metrics in its TensorBoard folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict, read_write
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

from laptrain.job.hparams import final_metrics, hp_keys
from tests.conftest import TINY, compose_train, write_texts


def hparams_row(board: Path) -> tuple[set[str], dict[str, object], dict[str, float]]:
    """(metric tags the HPARAMS tab lists, hyperparameters, last value of each hp/ scalar)."""
    events = EventAccumulator(str(board))
    events.Reload()
    content = events.PluginTagToContent("hparams")
    experiment = HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
    start = HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    params = {}
    for key, value in start.session_start_info.hparams.items():
        params[key] = value.number_value if value.HasField("number_value") else value.string_value
    scalars = {
        tag: events.Scalars(tag)[-1].value
        for tag in events.Tags()["scalars"]
        if tag.startswith("hp/")
    }
    return {m.name.tag for m in experiment.metric_infos}, params, scalars


def test_hp_keys_follow_the_optimized_metric():
    assert hp_keys("val/acc") == ("hp/best_val_acc", "hp/test_acc", "test/acc")
    assert hp_keys("val/exact_acc") == (
        "hp/best_val_exact_acc",
        "hp/test_exact_acc",
        "test/exact_acc",
    )
    assert hp_keys("train/loss")[0] == "hp/best_val_train_loss"


def test_what_a_rerun_did_not_measure_comes_from_the_run_folder(tmp_path):
    (tmp_path / "metrics.json").write_text(json.dumps({"val/acc": 0.5, "hp/best_val_acc": 0.75}))
    # a rerun of a finished run: no validation, a new test value
    got = final_metrics([], {"test/acc": 0.625}, "val/acc", tmp_path)
    assert got == {"val/acc": 0.5, "hp/best_val_acc": 0.75, "test/acc": 0.625, "hp/test_acc": 0.625}
    # a fresh run without a checkpoint callback: its last validation value
    assert (
        final_metrics([], {"val/acc": 0.25}, "val/acc", tmp_path / "new")["hp/best_val_acc"] == 0.25
    )


def job_config(args: list[str], tmp_path: Path) -> DictConfig:
    """The config a Hydra job gets: the hydra node only in HydraConfig, its run folder set."""
    cfg = compose_train(args, tmp_path)
    with read_write(cfg.hydra.runtime):
        cfg.hydra.runtime.output_dir = cfg.paths.output_dir
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


def test_a_run_returns_its_best_validation_and_the_same_when_rerun_finished(tmp_path):
    from laptrain.job.run import train

    args = [
        "hardware=cpu",
        "model=tiny_classifier",
        "data=text_csv",
        *TINY,
        f"data.files.train={write_texts(tmp_path / 'texts.csv')}",
        "debug=fast",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "model.optimizer.lr=0.002",
    ]
    first = train(job_config(args, tmp_path))
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    state = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    kept = [v for k, v in state["callbacks"].items() if v and v.get("monitor") == "val/acc"]
    assert first.status == "done" and first.metric is not None
    assert first.metric == metrics["hp/best_val_acc"] == float(kept[0]["best_model_score"])

    tags, params, scalars = hparams_row(run / "tensorboard")
    assert tags == {"hp/best_val_acc", "hp/test_acc"}
    assert abs(scalars["hp/best_val_acc"] - first.metric) < 1e-6
    assert params["model.optimizer.lr"] == params["lr"] == 0.002  # an override, typed
    assert params["profile"] == "cpu" and params["seed"] == 42 and params["micro_batch"] == 16
    assert params["parameters"] > 1000

    again = train(job_config(args, tmp_path))  # resumes a finished run: nothing to train
    assert again.metric == first.metric
    assert json.loads((run / "metrics.json").read_text())["hp/best_val_acc"] == first.metric
