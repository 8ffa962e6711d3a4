"""laptrain export never deletes what it did not write (issue 48 item 4): an export folder is
marked, only marked (or empty) folders are replaced, the base and the adapter being read are
refused even with --force, any other folder needs --force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laptrain.commands.cli import main
from laptrain.commands.export_folder import EXPORT_MARKER, export_target
from tests.test_causal_lm_lora import (
    _one_thread,  # noqa: F401 - module fixture
    base,  # noqa: F401 - module fixture
    tokenizer,  # noqa: F401 - module fixture
)


def written(folder: Path) -> None:
    folder.mkdir()
    (folder / "config.json").write_text("{}")


def test_an_export_is_marked_and_only_a_marked_or_empty_folder_is_replaced(tmp_path):
    out = export_target(tmp_path / "out", "hf").write(written)
    assert json.loads((out / EXPORT_MARKER).read_text()) == {"format": "hf"}
    (out / "stale.bin").write_text("from the last export")
    export_target(out, "hf").write(written)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", EXPORT_MARKER]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert export_target(empty, "gguf").write(written) == empty


def test_a_folder_no_export_wrote_needs_force_even_one_holding_config_json(tmp_path):
    theirs = tmp_path / "their-model"
    theirs.mkdir()
    (theirs / "config.json").write_text("{}")  # a model folder someone else wrote
    (theirs / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="--force") as err:
        export_target(theirs, "hf")
    assert "\n" not in str(err.value)
    assert (theirs / "notes.txt").read_text() == "keep me"
    export_target(theirs, "hf", force=True).write(written)
    assert not (theirs / "notes.txt").exists() and (theirs / EXPORT_MARKER).is_file()


@pytest.mark.parametrize("where", ["adapter", "run", "inside"])
def test_the_models_being_read_are_refused_even_with_force(tmp_path, where):
    run = tmp_path / "run"
    adapter = run / "adapter"
    adapter.mkdir(parents=True)
    (adapter / EXPORT_MARKER).write_text("{}")  # even one that looks like an export
    out = {"adapter": adapter, "run": run, "inside": adapter / "merged"}[where]
    with pytest.raises(ValueError, match="which this export reads") as err:
        export_target(out, "hf", [adapter], force=True)
    assert "\n" not in str(err.value)


def adapter_of(base: str, folder: Path) -> Path:  # noqa: F811
    """An untrained LoRA adapter of ``base``, written as training writes one."""
    from laptrain.families.lora.causal_lm import CausalLMLoRAModule
    from laptrain.families.lora.tools import _load_tokenizer

    tok = _load_tokenizer(Path(base))
    CausalLMLoRAModule(tok, pretrained=base, lora={"r": 4}).export(folder)
    return folder


@pytest.mark.parametrize("form", ["hf", "gguf"])
def test_export_into_the_base_or_the_run_exits_2_and_deletes_nothing(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    capsys,
    form,
):
    tokenizer.save_pretrained(base)
    adapter = adapter_of(base, tmp_path / "run" / "adapter")
    before = sorted(p.name for p in Path(base).iterdir())
    for out in (base, adapter, tmp_path / "run"):
        assert main(["export", str(adapter), "--format", form, "--out", str(out), "--force"]) == 2
        message = capsys.readouterr().err.strip()
        assert "which this export reads" in message and "\n" not in message
    assert sorted(p.name for p in Path(base).iterdir()) == before
    assert (adapter / "adapter_config.json").is_file()


# ----- issue 48 item 6: a full disk under peft/safetensors is one line, nothing partial ---------
def safetensors_on_a_full_disk(monkeypatch, *modules: str) -> None:
    """``save_file`` of ``modules`` (peft's, transformers') writes a few bytes, then fails as
    safetensors does on a full disk: a plain ``Exception`` with the OS error in its text."""
    import importlib

    from safetensors import SafetensorError

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 64)
        raise SafetensorError(
            "Error while serializing: I/O error: No space left on device (os error 28) at path "
            f'"{filename}"'
        )

    for module in modules:
        monkeypatch.setattr(importlib.import_module(module), "safe_save_file", full)


def test_a_full_disk_while_writing_a_step_adapter_is_one_line_and_keeps_the_last(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    from types import SimpleNamespace

    from laptrain.exit_codes import error_exit_code
    from laptrain.families.lora.causal_lm import CausalLMLoRAModule

    module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 4})
    module._write_step_adapter(SimpleNamespace(global_step=1, default_root_dir=str(tmp_path)), None)
    safetensors_on_a_full_disk(monkeypatch, "peft.peft_model")
    with pytest.raises(OSError, match="no space left") as err:
        module._write_step_adapter(
            SimpleNamespace(global_step=2, default_root_dir=str(tmp_path)), None
        )
    assert "\n" not in str(err.value) and "model.adapters_dir" in str(err.value)
    assert error_exit_code(err.value) == 2  # as a checkpoint that does not fit the disk
    left = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert left == ["step-000001"]  # no partial folder; the last adapter kept
    assert (tmp_path / "adapters" / "step-000001" / "adapter_model.safetensors").is_file()


def test_a_full_disk_during_an_hf_export_exits_2_in_one_line_and_leaves_nothing(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    tokenizer.save_pretrained(base)
    adapter = adapter_of(base, tmp_path / "run" / "adapter")
    safetensors_on_a_full_disk(monkeypatch, "transformers.modeling_utils")
    out = tmp_path / "merged"
    assert main(["export", str(adapter), "--out", str(out)]) == 2
    message = capsys.readouterr().err.strip()
    assert "no space left" in message and "--out" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # no out, no partial folder


def test_an_hf_export_without_room_for_its_weights_is_refused_before_writing(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    monkeypatch,
    capsys,
):
    import shutil

    tokenizer.save_pretrained(base)
    adapter = adapter_of(base, tmp_path / "run" / "adapter")
    usage = shutil._ntuple_diskusage(10**12, 10**12, 32 * 1024**2)  # 32 MiB free
    monkeypatch.setattr(shutil, "disk_usage", lambda _p: usage)
    assert main(["export", str(adapter), "--out", str(tmp_path / "merged")]) == 2
    message = capsys.readouterr().err.strip()
    assert "not enough disk for the export" in message and "\n" not in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


# ----- issue 48 item 13: GGUF export holds one float32 copy on the host, tensors streamed --------
def test_gguf_tensors_are_encoded_and_written_one_at_a_time(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    import weakref

    from transformers import LlamaForCausalLM

    import laptrain.families.lora.gguf.llama_tensors as llama_tensors
    from laptrain.families.lora.gguf.write import write_gguf

    real, live, counts = llama_tensors.encode, set(), []

    def encode(data, qtype):
        out = real(data, qtype)
        live.add(id(out))
        weakref.finalize(out, live.discard, id(out))
        counts.append(len(live))
        return out

    monkeypatch.setattr(llama_tensors, "encode", encode)
    model = LlamaForCausalLM.from_pretrained(base)
    target = export_target(tmp_path / "g", "gguf")
    done = write_gguf(model, tokenizer, target, "q8_0", "t", lambda _n: None)
    assert len(counts) > 10 and max(counts) <= 2  # never the whole encoded file in memory
    assert done.file.stat().st_size == done.bytes > 0


def test_a_gguf_export_merged_on_a_device_checks_the_host_it_is_written_from(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
    capsys,
):
    from laptrain.families.lora.gguf.write import export_gguf
    from laptrain.families.lora.tools import BaseTooLarge
    from laptrain.hardware.probe import MemoryReading
    from tests.fakes import FakeProbe

    tokenizer.save_pretrained(base)
    adapter = adapter_of(base, tmp_path / "run" / "adapter")

    def probe(kind):  # a large GPU on a host with 1 MiB free
        free = 2**40 if kind == "cuda" else 2**20
        reading = MemoryReading(0, free, free, 0.0, 0, device_limit=free, device_free=free)
        return FakeProbe(kind=kind, readings=[reading] * 4)

    with pytest.raises(BaseTooLarge, match="on cpu") as err:
        export_gguf(adapter, tmp_path / "g", device="cuda", probe=probe)
    assert "one tensor being encoded" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "g").exists()
