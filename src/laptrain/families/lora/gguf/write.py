"""``laptrain export <run> --format gguf [--quant f16|q8_0|q4_0]``: the run's adapter merged into
its base and written as ``<run>/gguf-<quant>/model.gguf`` with a ``Modelfile`` beside it.

Everything that can refuse does so before a byte is written: a run that is not a LoRA fine-tune,
a base that is not a Llama, a tokenizer llama.cpp would split differently, a chat template Ollama's
template language cannot express, a quantisation the ``gguf`` package cannot write, and a disk
without room for the file (its size is known exactly from the tensor shapes and types). The file
and the Modelfile are written into a hidden folder beside the target, the file fsynced, and the
folder renamed into place (:func:`laptrain.commands.export_folder.export_target`, the rule every
export format follows): a kill mid-write leaves no file under the asked-for name. The tensors are
encoded and written one at a time, from the merged model moved to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from laptrain.commands.export_folder import ExportTarget, export_target
from laptrain.families.lora.adapter_folders import default_export_dir
from laptrain.families.lora.gguf import llama_metadata, llama_tensors, modelfile, vocab
from laptrain.files import fsync_file

GGUF_NAME = "model.gguf"
MODELFILE = "Modelfile"


@dataclass(frozen=True)
class GgufExport:
    folder: Path
    file: Path
    bytes: int
    quant: str


def check_quant(quant: str) -> None:
    if quant not in llama_tensors.QUANTS:
        raise ValueError(
            f"--quant {quant}: use one of {', '.join(llama_tensors.QUANTS)} (the types the gguf "
            "package writes; for K-quants run llama.cpp's llama-quantize on the f16 file)"
        )


def refuse_non_lora(path: Path, form: str = "gguf") -> None:
    """A run folder of another family: one line saying what its export is (``form``: the
    ``--format`` refused)."""
    from laptrain.families.lora.adapter_folders import find_adapter
    from laptrain.families.lora.tools import _hydra_config, run_folder_of

    try:
        find_adapter(path)
        return
    except ValueError:
        pass
    run = run_folder_of(path)
    target = ((_hydra_config(run) if run else {}).get("model") or {}).get("_target_")
    if target and "lora" not in str(target).lower():
        raise ValueError(
            f"--format {form} writes a LoRA fine-tune of a language model; {path} trained "
            f"{target}, which has no {form.upper()} form: its exported model is {run / 'model'}"
        )


def _write_files(
    folder: Path,
    model: Any,
    tokenizer: Any,
    tensors: tuple[Any, list[Any]],
    quant: str,
    name: str,
    eot: str | None,
    text: str,
) -> None:
    """``folder/model.gguf`` (metadata, vocabulary, the tensor infos, then each tensor encoded and
    written in turn) and ``folder/Modelfile``."""
    import gguf

    state, planned = tensors
    config = model.config
    folder.mkdir(parents=True)
    path = folder / GGUF_NAME
    writer = gguf.GGUFWriter(str(path), "llama")
    rope_freqs = llama_metadata.add_llama_metadata(
        writer, config, name, llama_tensors.file_type_of(quant)
    )
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    vocab.add_tokenizer(writer, tokenizer, int(config.vocab_size), eot)
    if rope_freqs is not None:
        writer.add_tensor_info(
            "rope_freqs.weight", rope_freqs.shape, rope_freqs.dtype, rope_freqs.nbytes
        )
    for gguf_name, shape, qtype in planned:  # the infos first, the data streamed after them
        nbytes = llama_tensors.written_bytes(shape, qtype)
        writer.add_tensor_info(gguf_name, shape, np.float32, nbytes, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    if rope_freqs is not None:
        writer.write_tensor_data(rope_freqs)
    for _, data, qtype in llama_tensors.llama_tensors(state, config, quant):
        writer.write_tensor_data(llama_tensors.encode(data, qtype))
    writer.close()
    fsync_file(path)
    (folder / MODELFILE).write_text(text)


def write_gguf(
    model: Any,
    tokenizer: Any,
    target: ExportTarget,
    quant: str,
    name: str,
    free_check: Callable[[int], None] | None = None,
) -> GgufExport:
    """Write ``model`` (a merged transformers Llama, moved to the host) and ``tokenizer`` as
    ``target/model.gguf`` and ``target/Modelfile`` (its stops: the chat template's end-of-turn
    token and EOS), the tensors encoded and written one at a time; every check runs before
    anything is written."""

    from laptrain.families.lora.instructions import end_of_turn

    check_quant(quant)
    config = model.config
    llama_metadata.check_config(config)
    vocab.check_tokenizer(tokenizer)
    eot = end_of_turn(tokenizer) if tokenizer.chat_template else None
    stops = [end for end in (eot, tokenizer.eos_token) if end]
    text = modelfile.modelfile(GGUF_NAME, tokenizer, stops)  # refuses an inexpressible template
    # on the host first (a device's copy freed), then float32 views of its weights, one at a time
    # (copies only for the reordered q/k rows): sized here, encoded and written one by one below
    state = model.to("cpu").state_dict()
    planned = [(n, d.shape, q) for n, d, q in llama_tensors.llama_tensors(state, config, quant)]
    size = sum(llama_tensors.written_bytes(shape, qtype) for _, shape, qtype in planned)
    (free_check or target.check_space)(size)

    folder = target.write(
        lambda out: _write_files(out, model, tokenizer, (state, planned), quant, name, eot, text)
    )
    file = folder / GGUF_NAME
    return GgufExport(folder=folder, file=file, bytes=file.stat().st_size, quant=quant)


def export_gguf(
    path: str | Path,
    out: str | Path | None = None,
    quant: str = "f16",
    device: str | None = None,
    probe: Any = None,
    force: bool = False,
) -> GgufExport:
    """Merge the run's adapter into its base in float32 and write it as GGUF (see the module);
    ``force``: replace an ``out`` no export wrote (``--force``)."""
    import laptrain.families.lora.tools as lora_tools

    check_quant(quant)
    path = Path(path)
    refuse_non_lora(path)
    adapter = lora_tools.find_adapter(path)
    base = lora_tools.base_name_of(adapter)
    _check_base_config(base)
    folder = out or default_export_dir(adapter, f"gguf-{quant}")
    target = export_target(folder, "gguf", (adapter, base), force)
    record = lora_tools.read_record(adapter)
    plan = lora_tools.checked_plan(record, base, device, "float32", probe, False, encoding_extra)
    if plan.device != "cpu":  # merged there, the weights then come to the host to be written
        lora_tools.checked_plan(record, base, "cpu", "float32", probe, False, encoding_extra)
    tokenizer = lora_tools._load_tokenizer(adapter, base)
    merged = lora_tools.load_adapter_model(adapter, plan).merge_and_unload()
    run = lora_tools.run_folder_of(adapter)
    name = f"{Path(base).name}-{run.name if run else adapter.name}"
    with torch.no_grad():
        return write_gguf(merged, tokenizer, target, quant, name)


def encoding_extra(plan: Any, size: Any) -> Any:
    """The host's memory beyond the float32 weights while one tensor is encoded: its reordered
    copy and its float16-rounded copy (``llama_tensors.encode``), counted as the embedding's;
    nothing on a device, which only merges."""
    from laptrain.families.lora.tools import Extra

    if plan.device != "cpu":
        return Extra()
    return Extra(2.0 * 4 * size.embedding, "one tensor being encoded")


def _check_base_config(base: str) -> None:
    """The architecture refusal from the base's config alone, before any weight is read."""
    from laptrain.families.lora.gguf_source import config_from_pretrained
    from laptrain.families.lora.tools import BASE_FIX

    llama_metadata.check_config(config_from_pretrained(base, BASE_FIX))
