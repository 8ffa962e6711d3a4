"""``laptrain export RUN --format onnx`` (laptrain.commands.onnx_export, the classifier wing's
onnx_export) and ``laptrain predict`` on its folder (onnx_predict): onnxruntime gives the torch
model's labels and logits, at any batch and length, and predicts without importing torch."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip(
    "onnxruntime", reason='the onnx extra is not installed: pip install -e ".[onnx]"'
)
pytest.importorskip(
    "onnxscript", reason='the onnx extra is not installed: pip install -e ".[onnx]"'
)

import numpy as np  # noqa: E402
import onnxruntime  # noqa: E402
import torch  # noqa: E402
from hydra.utils import instantiate  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402

from laptrain.commands.cli import main  # noqa: E402
from laptrain.commands.export_folder import EXPORT_MARKER  # noqa: E402
from laptrain.families.classifier.predict import Classifier  # noqa: E402
from laptrain.run_folder.naming import register_resolvers  # noqa: E402
from tests.conftest import tiny_classifier_job  # noqa: E402
from tests.in_process import train_here  # noqa: E402
from tests.new_project import new_project  # noqa: E402
from tests.user_style import MYTASK, user_args, user_env  # noqa: E402

TEXTS = ["the team won the match", "bake", "storm and rain " * 30, "goal goal", "oven dough bread"]


def session(folder: Path) -> onnxruntime.InferenceSession:
    return onnxruntime.InferenceSession(str(folder / "model.onnx"))


def test_split(run: Path) -> list[str]:
    """The texts of the run's test split, as its datamodule split them."""
    register_resolvers()
    datamodule = instantiate(OmegaConf.load(run / ".hydra" / "config.yaml").data, batch_size=16)
    return datamodule.read_splits(datamodule._resolve_files()).texts["test"]


test_split.__test__ = False  # a helper, not a test


@pytest.fixture(scope="module")
def classifier_run(tmp_path_factory) -> Path:
    """The default job's model at tiny size, trained 3 epochs, exported as float32 and int8."""
    tmp = tmp_path_factory.mktemp("onnx")
    done = train_here([*tiny_classifier_job(tmp), "trainer.max_epochs=3", "logger=none"], tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    run = tmp / "outputs" / "tiny_classifier-text_csv"
    assert main(["export", str(run), "--format", "onnx"]) == 0
    assert main(["export", str(run), "--format", "onnx", "--quant", "int8"]) == 0
    return run


def logits_both_ways(run: Path, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """The torch model's and the ONNX graph's logits of ``texts`` as one padded batch."""
    classifier = Classifier(run)
    batch = classifier.tokenizer(
        texts, padding=True, truncation=True, max_length=classifier.max_length, return_tensors="pt"
    )
    with torch.inference_mode():
        expected = classifier.model(**batch).logits.numpy()
    feed = {i.name: batch[i.name].numpy() for i in session(run / "onnx").get_inputs()}
    return expected, session(run / "onnx").run(None, feed)[0]


def test_classifier_onnx_gives_torch_s_logits_at_any_batch_and_length(classifier_run, capsys):
    texts = test_split(classifier_run)
    expected, got = logits_both_ways(classifier_run, texts)
    assert len(texts) >= 20 and got.shape == expected.shape
    assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.999
    assert np.abs(got - expected).max() <= 1e-3
    for batch in (TEXTS[:1], TEXTS):  # batch 1 and 5, lengths 7 to 92 tokens
        expected, got = logits_both_ways(classifier_run, batch)
        assert got.shape == (len(batch), 3) and np.abs(got - expected).max() <= 1e-3
    exported = sorted(p.name for p in (classifier_run / "onnx").iterdir())
    assert exported == sorted([EXPORT_MARKER, "labels.json", "model.onnx", "tokenizer"])


def test_int8_is_smaller_and_labels_as_float32_mostly(classifier_run):
    int8, float32 = classifier_run / "onnx-int8", classifier_run / "onnx"
    assert (int8 / "model.onnx").stat().st_size < (float32 / "model.onnx").stat().st_size
    texts = test_split(classifier_run)
    from laptrain.families.classifier.onnx_predict import OnnxClassifier

    a, b = OnnxClassifier(int8).predict(texts), OnnxClassifier(float32).predict(texts)
    assert np.mean([x.label == y.label for x, y in zip(a, b)]) >= 0.9


def test_predict_on_the_onnx_folder_never_imports_torch(classifier_run, tmp_path):
    rows = tmp_path / "in.csv"
    rows.write_text("id,body\n" + "".join(f'{i},"{t}"\n' for i, t in enumerate(TEXTS)))
    script = (
        "import sys; from laptrain.commands.cli import main; "
        "code = main(sys.argv[1:]); assert 'torch' not in sys.modules, 'torch imported'; "
        "sys.exit(code)"
    )
    onnx = str(classifier_run / "onnx")
    done = subprocess.run(
        [sys.executable, "-c", script, "predict", onnx, *TEXTS[:2]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and lines[0].endswith("\tthe team won the match")
    out = tmp_path / "onnx.csv"
    done = subprocess.run(
        [sys.executable, "-c", script, "predict", onnx, "--file", str(rows), "--column", "body"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert main(["predict", str(classifier_run), "--file", str(rows), "--column", "body"]
                + ["--out", str(tmp_path / "torch.csv")]) == 0  # fmt: skip
    with out.open() as f, (tmp_path / "torch.csv").open() as g:
        from_onnx, from_torch = list(csv.DictReader(f)), list(csv.DictReader(g))
    assert (
        list(from_onnx[0])
        == list(from_torch[0])
        == ["id", "body", "predicted_label", "probability"]
    )
    assert [r["predicted_label"] for r in from_onnx] == [r["predicted_label"] for r in from_torch]
    for r, s in zip(from_onnx, from_torch):
        assert abs(float(r["probability"]) - float(s["probability"])) <= 1e-3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (
            ["--format", "tflite"],
            "is a TextClassifierModule run, which exports as onnx",
        ),
        (["--quant", "int4"], "--quant int4: --format onnx takes --quant int8"),
    ],
)
def test_unknown_format_or_quant_is_one_line(classifier_run, tmp_path, capsys, args, needle):
    assert main(["export", str(classifier_run), "--out", str(tmp_path / "x"), *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not (tmp_path / "x").exists()


def test_a_folder_no_export_wrote_is_kept_without_force(classifier_run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    assert main(["export", str(classifier_run), "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no laptrain-export.json" in err and "--force" in err
    assert (mine / "notes.txt").read_text() == "keep me"
    assert main(["export", str(classifier_run), "--out", str(mine), "--force"]) == 0
    assert (mine / "model.onnx").is_file() and not (mine / "notes.txt").exists()


def test_a_missing_extra_names_the_install_line(classifier_run, tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "onnxscript" else real(name, *a),
    )
    assert main(["export", str(classifier_run), "--out", str(tmp_path / "x")]) == 2
    assert (
        capsys.readouterr().err
        == 'error: --format onnx needs onnxscript: pip install -e ".[onnx]"\n'
    )


# A user's module as Lightning's docs write one: example_input_array set in __init__ (batch 1);
# and one whose forward branches on a tensor's value, which no graph can hold.
DOCS_STYLE = """

class LitClassifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.example_input_array = torch.zeros(1, 8)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val/acc", (self(x).argmax(-1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class BranchyClassifier(LitClassifier):
    def forward(self, x):
        if x.sum() > 0:
            return self.layer(x)
        return -self.layer(x)
"""


def user_run(tmp_path: Path, model: str) -> Path:
    (tmp_path / "conf" / "model").mkdir(parents=True)
    (tmp_path / "conf" / "data").mkdir(parents=True)
    (tmp_path / "mytask.py").write_text(MYTASK + DOCS_STYLE)
    (tmp_path / "conf" / "model" / f"{model}.yaml").write_text(f"_target_: mytask.{model}\n")
    (tmp_path / "conf" / "data" / "blobs.yaml").write_text("_target_: mytask.BlobsDataModule\n")
    args = ["hardware=cpu", "trainer.max_epochs=1", "logger=none", "test=false"]
    done = train_here([*args, f"model={model}", "data=blobs", *user_args(tmp_path)], tmp_path,
                      env=user_env(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return tmp_path / "outputs" / f"{model}-blobs"


def test_a_lightning_docs_module_exports_with_its_example_input_array(tmp_path, monkeypatch):
    run = user_run(tmp_path, "LitClassifier")
    monkeypatch.syspath_prepend(str(tmp_path))  # what user_env's PYTHONPATH gives a process
    monkeypatch.delitem(sys.modules, "mytask", raising=False)  # another test's
    assert main(["export", str(run), "--format", "onnx"]) == 0
    from laptrain.commands.onnx_export import load_run_module

    module = load_run_module(run)[0].eval()
    x = torch.randn(5, 8)  # another batch than the example's
    with torch.inference_mode():
        expected = module(x).numpy()
    got = session(run / "onnx").run(None, {"x": x.numpy()})[0]
    assert np.abs(got - expected).max() <= 1e-5


def test_a_forward_that_cannot_be_traced_is_one_line_naming_example_input_array(
    tmp_path, capsys, monkeypatch
):
    run = user_run(tmp_path, "BranchyClassifier")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "mytask", raising=False)  # another test's
    assert main(["export", str(run), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "error: BranchyClassifier.forward cannot be exported to ONNX (Could not guard on "
        "data-dependent expression"
    )
    assert err.count("\n") == 1 and "example_input_array" in err
    assert not (run / "onnx").exists()
    # run from where the project is not importable
    monkeypatch.delitem(sys.modules, "mytask")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(tmp_path)])
    assert main(["export", str(run), "--format", "onnx"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: cannot build mytask.BranchyClassifier of ")
        and "(No module named 'mytask')" in err
    )
    assert err.count("\n") == 1 and "PYTHONPATH" in err


def test_a_laptrain_new_module_exports_from_one_batch_of_its_datamodule(tmp_path, monkeypatch):
    clone = new_project(tmp_path / "clone")
    args = ["model=my_task", "data=my_task", "hardware=cpu", "trainer.max_epochs=1"]
    done = train_here([*args, "logger=none", "test=false"], clone, script=clone / "train.py")
    assert done.returncode == 0, done.stderr[-2000:]
    monkeypatch.chdir(clone)
    monkeypatch.syspath_prepend(str(clone))  # laptrain's own clone is this one, not the copy
    assert main(["export", "my_task-my_task", "--out", "served"]) == 0  # onnx: no family
    from laptrain.commands.onnx_export import load_run_module

    module = load_run_module(clone / "outputs" / "my_task-my_task")[0].eval()
    x = torch.randn(7, module.hparams.in_features)
    with torch.inference_mode():
        expected = module(x).numpy()
    got = session(clone / "served").run(None, {"x": x.numpy()})[0]
    assert (got.argmax(-1) == expected.argmax(-1)).all() and np.abs(got - expected).max() <= 1e-5
