"""``laptrain export | generate | eval``: what to do with a LoRA adapter after training.

Each takes a run folder (its ``adapter/`` is used, else the newest ``adapters/step-*``) or an
adapter folder (``adapter_config.json`` + ``adapter_model.safetensors`` + tokenizer); ``generate``
also takes a merged or plain model folder.

The base is loaded the way the run trained it (:func:`read_record`): on the run's device when this
machine has it (else on the CPU, said in one line), in the run's base dtype (bfloat16 only where
the device computes in it), 4-bit again on CUDA with bitsandbytes; ``device=`` / ``dtype=``
(``--device`` / ``--dtype``) override. Before any weight is read, :func:`check_memory` compares the
base's weights at that dtype (parameters counted on the meta device from ``config.json``) plus a
margin with the budget the training preflight would use on this machine, and refuses in one line
(exit 69, ``DOES_NOT_FIT_EXIT``, as the training preflight's refusal) when they do not fit.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from laptrain.commands.export_folder import export_target
from laptrain.families.lora.adapter_folders import (
    ADAPTER_CONFIG,
    default_export_dir,
    find_adapter,
)
from laptrain.hardware.probe import DEVICE_KINDS, DeviceProbe, TorchProbe
from laptrain.preflight.batch import PreflightError
from laptrain.preflight.estimate import DEVICE_ALLOCATOR_SLACK
from laptrain.pretrained.loading import from_pretrained

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
GiB = 1024**3
# What loading adds to the weights: the allocator's slack (the training preflight's) and a fixed
# headroom for the forward of one prompt, the KV cache and transformers' load buffers.
LOAD_SLACK = DEVICE_ALLOCATOR_SLACK
LOAD_HEADROOM = 0.25 * GiB
# A bitsandbytes nf4 weight with double quantization: 4 bits plus ~0.127 bits of scales.
NF4_BYTES = 0.516
ProbeFactory = Callable[[str], DeviceProbe]


class BaseTooLarge(PreflightError):
    """The base at the chosen dtype does not fit the memory budget; one line with the fix (a
    preflight refusal: the command exits ``DOES_NOT_FIT_EXIT``, as train.py would)."""


def _note(line: str) -> None:
    """One line on stderr (stdout carries the reply, the table, the folder written)."""
    print(line, file=sys.stderr)


def _load_tokenizer(folder: Path, fallback: str | None = None) -> Any:
    from transformers import AutoTokenizer

    source = str(folder) if (folder / "tokenizer_config.json").is_file() else fallback
    if source is None:
        raise ValueError(f"no tokenizer in {folder}: save the tokenizer beside the adapter")
    return from_pretrained(
        AutoTokenizer.from_pretrained, source, "tokenizer", "keep the tokenizer beside the adapter"
    )


# ----- what the run used, and how to load it here ------------------------------------------------
@dataclass(frozen=True)
class RunRecord:
    """How a run loaded its base, as its folder records it (nothing recorded: a float32 CPU run).

    ``device``: the adapter's ``training_config.json``, else ``run_info.json``'s plan, else the
    run's ``.hydra/config.yaml`` accelerator. ``base_dtype`` and ``quantization``: the module's
    hyperparameters in ``training_config.json`` (``base_dtype: auto`` resolved), else the Hydra
    config's model. ``hardware``: the run's profile, whose memory rule sizes the budget.
    """

    device: str = "cpu"
    base_dtype: str = "float32"
    quantization: str | None = None
    hardware: Mapping[str, Any] = field(default_factory=dict)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _hydra_config(run: Path) -> dict[str, Any]:
    path = run / ".hydra" / "config.yaml"
    if not path.is_file():
        return {}
    from omegaconf import OmegaConf

    try:
        data = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # noqa: BLE001 - an unreadable record means "not recorded"
        return {}
    return data if isinstance(data, dict) else {}


def run_folder_of(folder: Path) -> Path | None:
    """The run folder ``folder`` belongs to (``<run>/adapter``, ``<run>/merged``,
    ``<run>/adapters/step-*``), or None when no ``run_info.json`` / ``.hydra`` is found."""
    for candidate in (folder, folder.parent, folder.parent.parent):
        if (candidate / "run_info.json").is_file() or (candidate / ".hydra").is_dir():
            return candidate
    return None


def _accelerator_kind(hydra: Mapping[str, Any]) -> str | None:
    trainer, hardware = hydra.get("trainer") or {}, hydra.get("hardware") or {}
    accelerator = str(trainer.get("accelerator") or hardware.get("accelerator") or "")
    return "cuda" if accelerator == "gpu" else accelerator or None


def read_record(folder: Path) -> RunRecord:
    """What the run that wrote ``folder`` (an adapter folder, or a merged/plain model folder)
    used: device, base dtype, quantization, hardware profile."""
    trained = _read_json(folder / "training_config.json")
    hparams = trained.get("hparams") or {}
    run = run_folder_of(folder)
    plan = (_read_json(run / "run_info.json").get("plan") or {}) if run else {}
    hydra = _hydra_config(run) if run else {}
    model = hydra.get("model") or {}
    device = str(trained.get("device") or plan.get("device") or _accelerator_kind(hydra) or "cpu")
    dtype = hparams.get("base_dtype") or model.get("base_dtype")
    if not (folder / ADAPTER_CONFIG).is_file() and (folder / "config.json").is_file():
        config = _read_json(folder / "config.json")  # a merged model: the dtype it was written in
        dtype = config.get("dtype") or config.get("torch_dtype")
    quantization = hparams.get("quantization", model.get("quantization"))
    return RunRecord(
        device=device if device in DEVICE_KINDS else "cpu",
        base_dtype=str(dtype) if dtype in DTYPES else "float32",  # auto unresolved: float32
        quantization="4bit" if quantization == "4bit" else None,
        hardware=hydra.get("hardware") or {},
    )


@dataclass(frozen=True)
class LoadPlan:
    """Where and how the base is loaded: a device kind, a dtype, and 4-bit (CUDA) or not."""

    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    quantization: str | None = None

    @property
    def dtype_name(self) -> str:
        name = str(self.dtype).replace("torch.", "")
        return f"4-bit (nf4, {name} elsewhere)" if self.quantization == "4bit" else name

    def kwargs(self) -> dict[str, Any]:
        """``from_pretrained`` arguments: the dtype, and off the CPU the device to load onto
        (straight onto it: no float32 copy in host memory first)."""
        kwargs: dict[str, Any] = {"dtype": self.dtype}
        if self.device != "cpu":
            kwargs["device_map"] = self.device
        return kwargs


def _has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def plan_load(
    record: RunRecord,
    device: str | None = None,
    dtype: str | None = None,
    probe: ProbeFactory | None = None,
    quantized: bool = True,
) -> tuple[LoadPlan, DeviceProbe]:
    """The device and dtype to load on (and the probe of that device): the run's, or
    ``device`` / ``dtype`` when given. A recorded device this machine lacks falls back to the CPU,
    a bfloat16 base on a device without native bfloat16 to float32, a 4-bit base off CUDA (or
    with ``quantized=False``: an export) to bfloat16/float32, each with one line."""
    make = probe or TorchProbe
    if device is not None:
        if device not in DEVICE_KINDS:
            raise ValueError(f"--device {device}: use one of {', '.join(DEVICE_KINDS)}")
        found = make(device)
        if not found.available():
            raise ValueError(
                f"--device {device} is not available on this machine: use --device cpu"
            )
    else:
        found = make(record.device)
        if not found.available():
            _note(
                f"the run trained on {record.device}, which this machine cannot use: loading on cpu"
            )
            found = make("cpu")
    kind = found.kind
    if dtype not in (None, "auto"):
        if dtype not in DTYPES:
            raise ValueError(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
        return LoadPlan(kind, DTYPES[str(dtype)]), found
    bf16 = found.bf16_supported()
    if record.quantization == "4bit":
        if quantized and kind == "cuda" and _has_bitsandbytes():
            return LoadPlan(kind, DTYPES[record.base_dtype], "4bit"), found
        fallback = "bfloat16" if bf16 else "float32"
        why = (
            "a merged model is written unquantized"
            if not quantized
            else "4-bit loads need CUDA with bitsandbytes"
        )
        _note(f"the run's base was 4-bit ({why}): loading it in {fallback} on {kind}")
        return LoadPlan(kind, DTYPES[fallback]), found
    if record.base_dtype == "bfloat16" and not bf16:
        _note(
            f"the run's base was bfloat16, which this {kind} device has no native support for: "
            "loading it in float32"
        )
        return LoadPlan(kind, torch.float32), found
    return LoadPlan(kind, DTYPES[record.base_dtype]), found


@dataclass(frozen=True)
class BaseSize:
    """A base's size from its ``config.json`` alone (counted on the meta device)."""

    params: int
    embedding: int  # input embeddings and an untied output head: 16-bit even in a 4-bit load
    vocab: int

    def weight_bytes(self, plan: LoadPlan) -> float:
        if plan.quantization == "4bit":
            quantized = self.params - self.embedding
            return quantized * NF4_BYTES + self.embedding * plan.dtype.itemsize
        return float(self.params * plan.dtype.itemsize)


def base_size(name: str, fix: str) -> BaseSize:
    """Parameters, embedding parameters and vocabulary of the model ``name`` (folder, hub name or
    GGUF) from its config; no weights are read."""
    from laptrain.families.lora.base_dtype import base_parameter_count
    from laptrain.families.lora.gguf_source import config_from_pretrained

    config = config_from_pretrained(name, fix)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    params = base_parameter_count({"pretrained": name}) or 0
    vocab, hidden = int(text.vocab_size), int(text.hidden_size)
    tied = bool(getattr(text, "tie_word_embeddings", getattr(config, "tie_word_embeddings", True)))
    return BaseSize(params, vocab * hidden * (1 if tied else 2), vocab)


def _budget_settings(kind: str, record: RunRecord) -> Mapping[str, Any]:
    """The memory rule of the run's profile when loading on the run's device, else the rule of
    laptrain's profile for ``kind`` (cpu, cuda, mps)."""
    if record.device == kind and record.hardware:
        return record.hardware
    from laptrain.hardware.profile import load_profile

    try:
        return load_profile(kind)
    except ValueError:  # no profile (or no clone): the profiles' default fraction
        return {}


def _count(params: int) -> str:
    return f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.1f} M"


def _number(value: Any, default: float | None) -> float | None:
    try:
        return float(value) if value is not None else default
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Extra:
    """Memory a tool needs beyond the weights (eval: the logits of one batch), and its fix."""

    bytes: float = 0.0
    what: str = ""
    fix: str = ""


def check_memory(
    plan: LoadPlan,
    probe: DeviceProbe,
    record: RunRecord,
    size: BaseSize,
    extra: Extra | None = None,
) -> None:
    """Refuse (:class:`BaseTooLarge`, one line) a base whose weights at ``plan``'s dtype, plus
    :data:`LOAD_SLACK` and :data:`LOAD_HEADROOM` (and ``extra``), exceed the budget the training
    preflight would use on this device (``laptrain.preflight.budget.device_budget`` with the run's
    profile). On the CPU the budget counts this process, so the need does too."""
    from laptrain.preflight.budget import device_budget

    extra = extra or Extra()
    hardware = _budget_settings(plan.device, record)
    fraction = _number(hardware.get("memory_fraction"), 0.8) or 0.8
    budget = device_budget(probe, fraction, _number(hardware.get("memory_budget_gb"), None))
    process = float(probe.memory().rss) if plan.device == "cpu" else 0.0

    def need(weights: float) -> float:
        return weights * (1 + LOAD_SLACK) + LOAD_HEADROOM + extra.bytes + process

    weights = size.weight_bytes(plan)
    if need(weights) <= budget.bytes:
        return
    parts = f"weights {weights / GiB:.2f} + {LOAD_SLACK:.0%} + {LOAD_HEADROOM / GiB:.2f} GiB"
    if extra.bytes:
        parts += f" + {extra.what} {extra.bytes / GiB:.2f} GiB"
    if process:
        parts += f" + this process {process / GiB:.2f} GiB"
    fixes = []
    if plan.quantization is None and plan.dtype != torch.bfloat16 and probe.bf16_supported():
        half = need(size.weight_bytes(LoadPlan(plan.device, torch.bfloat16)))
        if half <= budget.bytes:
            fixes.append(f"--dtype bfloat16 (needs {half / GiB:.2f} GiB)")
    if extra.fix:
        fixes.append(extra.fix)
    fixes.append("a machine whose hardware profile has a larger budget")
    raise BaseTooLarge(
        f"the base does not fit: {_count(size.params)} parameters in {plan.dtype_name} on "
        f"{plan.device} need {need(weights) / GiB:.2f} GiB ({parts}), over the "
        f"{budget.bytes / GiB:.2f} GiB budget ({budget.source}); nothing loaded or written: use "
        + ", or ".join(fixes)
    )


BASE_FIX = "edit base_model_name_or_path in adapter_config.json to the base's folder, or go online"


def base_name_of(adapter: Path) -> str:
    """The base an adapter was trained on (``base_model_name_or_path``)."""
    name = _read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    if not name:
        raise ValueError(
            f"{adapter / ADAPTER_CONFIG} names no base_model_name_or_path: set it to the base "
            "model's folder or hub name"
        )
    return str(name)


def checked_plan(
    record: RunRecord,
    name: str,
    device: str | None = None,
    dtype: str | None = None,
    probe: ProbeFactory | None = None,
    quantized: bool = True,
    extra: Callable[[LoadPlan, BaseSize], Extra] | None = None,
) -> LoadPlan:
    """:func:`plan_load`, then :func:`check_memory` of the model ``name``: the plan to load with."""
    plan, found = plan_load(record, device, dtype, probe, quantized)
    size = base_size(name, BASE_FIX)
    check_memory(plan, found, record, size, extra(plan, size) if extra else None)
    return plan


def load_base_for(adapter: Path, plan: LoadPlan | torch.dtype | str = torch.float32) -> Any:
    """The base model an adapter was trained on (``base_model_name_or_path``, ``revision``),
    loaded as ``plan`` says (a bare dtype: on the CPU)."""
    from transformers import AutoModelForCausalLM

    if not isinstance(plan, LoadPlan):
        plan = LoadPlan("cpu", plan)  # type: ignore[arg-type]
    name = base_name_of(adapter)
    revision = _read_json(adapter / ADAPTER_CONFIG).get("revision")
    if plan.quantization == "4bit":  # exactly as training loaded it (nf4, double quantization)
        from laptrain.families.lora.causal_lm import load_base

        return load_base(name, None, plan.dtype, revision, "4bit")
    kwargs = plan.kwargs()
    if revision:
        kwargs["revision"] = revision
    return from_pretrained(
        partial(AutoModelForCausalLM.from_pretrained, **kwargs), name, "base model", BASE_FIX
    )


def load_adapter_model(adapter: Path, plan: LoadPlan | torch.dtype | str = torch.float32) -> Any:
    """Base + adapter as a peft model in eval mode."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_base_for(adapter, plan), str(adapter))
    return model.eval()


def load_for_generation(
    path: str | Path,
    device: str | None = None,
    dtype: str | None = None,
    probe: ProbeFactory | None = None,
) -> tuple[Any, Any]:
    """(model, tokenizer) from an adapter, a run folder, or a merged/plain model folder, on the
    run's device and in its base dtype (or ``device`` / ``dtype``), after the memory check."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "config.json").is_file() and not (path / ADAPTER_CONFIG).is_file():
        plan = checked_plan(read_record(path), str(path), device, dtype, probe, quantized=False)
        model = from_pretrained(
            partial(AutoModelForCausalLM.from_pretrained, **plan.kwargs()),
            str(path),
            "model",
            "point at a model or adapter folder",
        )
        return model.eval(), _load_tokenizer(path)
    adapter = find_adapter(path)
    name = base_name_of(adapter)
    plan = checked_plan(read_record(adapter), name, device, dtype, probe)
    model = load_adapter_model(adapter, plan)
    return model, _load_tokenizer(adapter, name)


def export_merged(
    path: str | Path,
    out: str | Path | None = None,
    dtype: str | None = None,
    device: str | None = None,
    probe: ProbeFactory | None = None,
    force: bool = False,
) -> Path:
    """Merge the adapter into its base (``merge_and_unload``) and write a plain transformers model
    folder with the tokenizer: ``AutoModelForCausalLM.from_pretrained(out)`` needs no peft.

    The merged weights are written in ``dtype`` (default: the run's base dtype; a 4-bit run's in
    bfloat16 where the device has it). Nothing is written when the base does not fit, nor where
    :func:`laptrain.commands.export_folder.export_target` refuses ``out`` (``force``: ``--force``)."""
    adapter = find_adapter(path)
    name = base_name_of(adapter)
    target = export_target(
        out or default_export_dir(adapter, "merged"), "hf", (adapter, name), force
    )
    plan = checked_plan(read_record(adapter), name, device, dtype, probe, quantized=False)
    tokenizer = _load_tokenizer(adapter, name)
    merged = load_adapter_model(adapter, plan).merge_and_unload()
    tensors = {t.data_ptr(): t for t in merged.state_dict().values()}.values()  # tied: once
    target.check_space(sum(t.numel() * t.element_size() for t in tensors))

    def write(folder: Path) -> None:
        merged.save_pretrained(str(folder))
        tokenizer.save_pretrained(str(folder))

    return target.write(write)


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Ids that end an assistant turn: the template's end-of-turn token and EOS."""
    from laptrain.families.lora.instructions import end_of_turn

    ids = []
    for token in (end_of_turn(tokenizer), tokenizer.eos_token):
        if token is None:
            continue
        found = tokenizer.convert_tokens_to_ids(token)
        if found is not None and found != tokenizer.unk_token_id and found not in ids:
            ids.append(found)
    return ids


def generate(
    model: Any,
    tokenizer: Any,
    prompt: str | list[dict[str, str]],
    max_new_tokens: int = 128,
    system_prompt: str | None = None,
    temperature: float = 0.0,
    stream: bool = True,
) -> str:
    """The reply to ``prompt``, rendered exactly as the training prefix (``render_prompt``);
    greedy unless ``temperature > 0``, streamed to stdout, stopped at end-of-turn."""
    from transformers import TextStreamer

    from laptrain.families.lora.instructions import render_prompt

    ids = torch.tensor([render_prompt(tokenizer, prompt, system_prompt)], device=model.device)
    stop = end_of_turn_ids(tokenizer)
    options: dict[str, Any] = {"do_sample": False}
    if temperature > 0:
        options = {"do_sample": True, "temperature": temperature}
    streamer = (
        TextStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True) if stream else None
    )
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            eos_token_id=stop,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop[0],
            streamer=streamer,
            **options,
        )
    return tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def masked_loss(
    model: Any, examples: list[tuple[list[int], list[int]]], batch_size: int = 8
) -> tuple[float, int]:
    """Mean cross-entropy over the response tokens of ``(input_ids, labels)`` examples."""
    from laptrain.families.lora.instructions import IGNORE, padded_examples

    total, count = 0.0, 0
    device = model.device
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            ids, mask, labels = padded_examples(examples[start : start + batch_size])
            logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
            shifted = labels[:, 1:].to(device)
            keep = shifted != IGNORE
            total += float(
                torch.nn.functional.cross_entropy(
                    logits[:, :-1][keep].float(), shifted[keep], reduction="sum"
                )
            )
            count += int(keep.sum())
    if count == 0:
        raise ValueError("the data has no response tokens to evaluate")
    return total / count, count


def read_examples(
    tokenizer: Any, data: str | Path, max_length: int | None = None
) -> list[tuple[list[int], list[int]]]:
    """``(input_ids, labels)`` per row of a JSONL/CSV/Parquet file, encoded as in training."""
    from laptrain.families.lora.instruction_rows import bad_rows_error, read_rows, row_messages
    from laptrain.families.lora.instructions import encode_chat

    rows = read_rows(Path(data))
    examples, bad = [], []
    for where, row in rows:
        messages = row_messages(row)
        if isinstance(messages, str):
            bad.append((where, messages))
            continue
        ids, labels, _ = encode_chat(tokenizer, messages, max_length)
        examples.append((ids, labels))
    if bad:
        raise bad_rows_error(bad, len(rows))
    return examples


@dataclass
class EvalResult:
    """Masked loss of the base and of base + adapter on the same examples."""

    adapter: Path
    base_loss: float
    adapter_loss: float
    examples: int
    tokens: int

    def markdown(self) -> str:
        """A markdown table, plus the counts and the relative change."""
        rows = [("base", self.base_loss), (f"adapter ({self.adapter})", self.adapter_loss)]
        lines = ["| model | loss | perplexity |", "|---|---:|---:|"]
        lines += [
            f"| {name} | {loss:.4f} | {math.exp(min(loss, 50.0)):.2f} |" for name, loss in rows
        ]
        change = (
            (self.adapter_loss - self.base_loss) / self.base_loss * 100 if self.base_loss else 0
        )
        lines += [
            "",
            f"{self.examples} examples, {self.tokens} response tokens; "
            f"adapter loss {change:+.1f}% vs base",
        ]
        return "\n".join(lines)


def logits_extra(batch_size: int, width: int) -> Callable[[LoadPlan, BaseSize], Extra]:
    """Eval's memory beyond the weights: one batch's logits (B x S x V in the model's dtype) and
    the float32 copy the loss takes of them."""

    def extra(plan: LoadPlan, size: BaseSize) -> Extra:
        per = plan.dtype.itemsize + 4
        fix = f"--batch-size {max(1, batch_size // 2)}" if batch_size > 1 else ""
        return Extra(
            float(batch_size * width * size.vocab * per), f"logits {batch_size}x{width}", fix
        )

    return extra


def evaluate(
    path: str | Path,
    data: str | Path,
    max_length: int | None = None,
    batch_size: int = 8,
    device: str | None = None,
    dtype: str | None = None,
    probe: ProbeFactory | None = None,
) -> Any:
    """Masked loss of the base (adapter disabled) and of base + adapter on ``data``; the data is
    read first, so the memory check counts the logits of its longest batch. A file of preference
    pairs gets the DPO metrics instead (``laptrain.families.lora.preference_eval``)."""
    import laptrain.families.lora.preference_eval as preference_eval

    adapter = find_adapter(path)
    name = base_name_of(adapter)
    tokenizer = _load_tokenizer(adapter, name)
    if preference_eval.is_preference_file(data):  # a DPO run's metrics on the pairs
        pairs = preference_eval.read_pairs(tokenizer, data, max_length)
        width = max((len(ids) for pair in pairs for ids, _ in pair), default=0)
        extra = logits_extra(2 * min(batch_size, max(1, len(pairs))), width)
        plan = checked_plan(read_record(adapter), name, device, dtype, probe, extra=extra)
        model = load_adapter_model(adapter, plan)
        return preference_eval.evaluate_preferences(model, adapter, pairs, batch_size)
    examples = read_examples(tokenizer, data, max_length)
    width = max((len(ids) for ids, _ in examples), default=0)
    extra = logits_extra(min(batch_size, max(1, len(examples))), width)
    plan = checked_plan(read_record(adapter), name, device, dtype, probe, extra=extra)
    model = load_adapter_model(adapter, plan)
    with model.disable_adapter():
        base_loss, count = masked_loss(model, examples, batch_size)
    loss, _ = masked_loss(model, examples, batch_size)
    return EvalResult(adapter, base_loss, loss, len(examples), count)
