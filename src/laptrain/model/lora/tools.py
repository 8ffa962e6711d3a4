"""``laptrain export | generate | eval``: what to do with a LoRA adapter after training.

Each takes a run folder (its ``adapter/`` is used, else the newest ``adapters/step-*``) or an
adapter folder (``adapter_config.json`` + ``adapter_model.safetensors`` + tokenizer); ``generate``
also takes a merged or plain model folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from laptrain.pretrained.loading import from_pretrained

ADAPTER_CONFIG = "adapter_config.json"


def find_adapter(path: str | Path) -> Path:
    """The adapter folder for ``path``: itself, its ``adapter/`` or ``model/``, or the newest
    ``adapters/step-*``. Raises a one-line ValueError when there is none."""
    path = Path(path)
    for candidate in (path, path / "adapter", path / "model"):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    steps = sorted(p for p in (path / "adapters").glob("step-*") if (p / ADAPTER_CONFIG).is_file())
    if steps:
        return steps[-1]
    raise ValueError(
        f"no {ADAPTER_CONFIG} in {path} (nor in its adapter/ or adapters/step-*/): point at a LoRA "
        "run folder or an adapter folder written by training"
    )


def _load_tokenizer(folder: Path, fallback: str | None = None) -> Any:
    from transformers import AutoTokenizer

    source = str(folder) if (folder / "tokenizer_config.json").is_file() else fallback
    if source is None:
        raise ValueError(f"no tokenizer in {folder}: save the tokenizer beside the adapter")
    return from_pretrained(
        AutoTokenizer.from_pretrained, source, "tokenizer", "keep the tokenizer beside the adapter"
    )


def load_base_for(adapter: Path, dtype: torch.dtype | str = torch.float32) -> Any:
    """The base model an adapter was trained on (``base_model_name_or_path``, ``revision``)."""
    from transformers import AutoModelForCausalLM

    config = json.loads((adapter / ADAPTER_CONFIG).read_text())
    name = config.get("base_model_name_or_path")
    if not name:
        raise ValueError(
            f"{adapter / ADAPTER_CONFIG} names no base_model_name_or_path: set it to the base "
            "model's folder or hub name"
        )
    kwargs: dict[str, Any] = {"dtype": dtype}
    if config.get("revision"):
        kwargs["revision"] = config["revision"]
    return from_pretrained(
        partial(AutoModelForCausalLM.from_pretrained, **kwargs),
        str(name),
        "base model",
        "edit base_model_name_or_path in adapter_config.json to the base's folder, or go online",
    )


def load_adapter_model(adapter: Path, dtype: torch.dtype | str = torch.float32) -> Any:
    """Base + adapter as a peft model in eval mode."""
    from peft import PeftModel

    model = PeftModel.from_pretrained(load_base_for(adapter, dtype), str(adapter))
    return model.eval()


def load_for_generation(path: str | Path) -> tuple[Any, Any]:
    """(model, tokenizer) from an adapter, a run folder, or a merged/plain model folder."""
    from transformers import AutoModelForCausalLM

    path = Path(path)
    if (path / "config.json").is_file() and not (path / ADAPTER_CONFIG).is_file():
        model = from_pretrained(
            partial(AutoModelForCausalLM.from_pretrained, dtype=torch.float32),
            str(path),
            "model",
            "point at a model or adapter folder",
        )
        return model.eval(), _load_tokenizer(path)
    adapter = find_adapter(path)
    model = load_adapter_model(adapter)
    base_name = model.peft_config["default"].base_model_name_or_path
    return model, _load_tokenizer(adapter, base_name)


def default_export_dir(adapter: Path) -> Path:
    """``<run>/merged`` beside a run's ``adapter/``; else ``<adapter>-merged``."""
    if adapter.name in ("adapter", "model"):
        return adapter.parent / "merged"
    return adapter.with_name(f"{adapter.name}-merged")


def export_merged(path: str | Path, out: str | Path | None = None, dtype: str = "float32") -> Path:
    """Merge the adapter into its base (``merge_and_unload``) and write a plain transformers model
    folder with the tokenizer: ``AutoModelForCausalLM.from_pretrained(out)`` needs no peft."""
    adapter = find_adapter(path)
    target = Path(out) if out else default_export_dir(adapter)
    load_dtype = getattr(torch, dtype) if dtype != "auto" else "auto"
    model = load_adapter_model(adapter, load_dtype)
    base_name = model.peft_config["default"].base_model_name_or_path
    merged = model.merge_and_unload()
    target.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(str(target))
    _load_tokenizer(adapter, base_name).save_pretrained(str(target))
    return target


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """Ids that end an assistant turn: the template's end-of-turn token and EOS."""
    from laptrain.data.instructions import end_of_turn

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

    from laptrain.data.instructions import render_prompt

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
    from laptrain.data.instructions import IGNORE

    total, count = 0.0, 0
    device = model.device
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            chunk = examples[start : start + batch_size]
            width = max(len(ids) for ids, _ in chunk)
            ids = torch.zeros((len(chunk), width), dtype=torch.long)
            mask = torch.zeros_like(ids)
            labels = torch.full_like(ids, IGNORE)
            for i, (row_ids, row_labels) in enumerate(chunk):
                ids[i, : len(row_ids)] = torch.tensor(row_ids)
                mask[i, : len(row_ids)] = 1
                labels[i, : len(row_labels)] = torch.tensor(row_labels)
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
    from laptrain.data.instruction_rows import bad_rows_error, read_rows, row_messages
    from laptrain.data.instructions import encode_chat

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


def evaluate(
    path: str | Path, data: str | Path, max_length: int | None = None, batch_size: int = 8
) -> EvalResult:
    """Masked loss of the base (adapter disabled) and of base + adapter on ``data``."""
    adapter = find_adapter(path)
    model = load_adapter_model(adapter)
    tokenizer = _load_tokenizer(adapter, model.peft_config["default"].base_model_name_or_path)
    examples = read_examples(tokenizer, data, max_length)
    with model.disable_adapter():
        base_loss, count = masked_loss(model, examples, batch_size)
    loss, _ = masked_loss(model, examples, batch_size)
    return EvalResult(adapter, base_loss, loss, len(examples), count)
