"""Preference pairs for DPO: each row tokenized twice (prompt + chosen, prompt + rejected) through
the chat template and masking of instruction data, cached once, batched as pairs.

``PreferenceDataModule`` is ``InstructionDataModule`` with other rows
(``laptrain.families.lora.preference_rows``) and other examples: a cached example holds the chosen and the
rejected sequence with their labels (-100 off the answer), and ``length`` is the longer of the
two, so length-grouped batches group pairs. A batch is ``[B, 2, L]``: row ``b`` holds pair ``b``'s
chosen (0) and rejected (1) sequence, padded to one width, so cutting a batch into smaller ones
(the OOM backoff) never separates a pair. Packing is refused: a pair's two sequences must each see
only their own prompt.

``build_stdlib_preferences`` makes the offline preference set: for each documented stdlib
function, the question "What does `mod.func` do?", its docstring's first sentence as the chosen
answer, and the first sentence of another function of the same module as the rejected one.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from laptrain.data.collate import padded_length
from laptrain.data.file_formats import DataError
from laptrain.families.classifier.stdlib_docstrings import write_jsonl
from laptrain.families.classifier.tokenizer import load_tokenizer
from laptrain.families.lora.chat_tokenizer import prepare_chat_tokenizer
from laptrain.families.lora.instructions import (
    IGNORE,
    InstructionDataModule,
    _ids,
    _join,
    end_of_turn,
    segment_texts,
)
from laptrain.families.lora.preference_rows import bad_preference_rows, read_preferences
from laptrain.families.lora.stdlib_instructions import collect_pairs

PAIR_CACHE_VERSION = 1


def build_stdlib_preferences(
    cache_dir: str, modules: list[str], min_chars: int = 12, max_chars: int = 200, seed: int = 0
) -> dict[str, str]:
    """Write the offline preference rows to ``<cache_dir>/stdlib_preferences/<key>.jsonl`` once
    (``{prompt, chosen, rejected, module}``); return ``{"all": path}``."""
    if not modules:
        raise ValueError(
            "data.builder.modules is empty: list stdlib modules in conf/data/stdlib_preferences.yaml"
        )
    spec = json.dumps(
        {"python": sys.version, "modules": [str(m) for m in modules], "seed": seed,
         "chars": [min_chars, max_chars], "version": PAIR_CACHE_VERSION},
        sort_keys=True,
    )  # fmt: skip
    out = (
        Path(cache_dir)
        / "stdlib_preferences"
        / f"{hashlib.sha256(spec.encode()).hexdigest()[:16]}.jsonl"
    )
    if not out.exists():
        pairs = collect_pairs([str(m) for m in modules], min_chars=min_chars, max_chars=max_chars)
        by_module: dict[str, list[dict[str, str]]] = {}
        for pair in pairs:
            by_module.setdefault(pair["module"], []).append(pair)
        rng = random.Random(seed)
        rows = []
        for module_pairs in by_module.values():
            answers = sorted({p["response"] for p in module_pairs})
            for pair in module_pairs:
                others = [a for a in answers if a != pair["response"]]
                if others:
                    rows.append(
                        {"prompt": pair["prompt"], "chosen": pair["response"],
                         "rejected": rng.choice(others), "module": pair["module"]}
                    )  # fmt: skip
        if not rows:
            raise FileNotFoundError(
                f"no preference pairs from {', '.join(map(str, modules))}: these modules document "
                "fewer than two functions each, or this Python ships without its sources"
            )
        write_jsonl(out, rows)
    return {"all": str(out)}


def _pair_features() -> Any:
    import datasets

    ids = datasets.List(datasets.Value("int32"))
    return datasets.Features(
        {"chosen_ids": ids, "chosen_labels": ids, "rejected_ids": ids, "rejected_labels": ids,
         "length": datasets.Value("int32")}
    )  # fmt: skip


@dataclass
class PairCollator:
    """``input_ids``/``attention_mask``/``labels`` of shape ``[B, 2, L]`` (chosen, rejected),
    right-padded to one width, and ``num_response_tokens``."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        sequences = [
            (r[f"{side}_ids"], r[f"{side}_labels"]) for r in rows for side in ("chosen", "rejected")
        ]
        width = padded_length(max(len(ids) for ids, _ in sequences), self.pad_to_multiple_of)
        ids = torch.full((len(sequences), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(sequences), width), IGNORE, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for i, (seq, lab) in enumerate(sequences):
            ids[i, : len(seq)] = torch.as_tensor(seq, dtype=torch.long)
            labels[i, : len(lab)] = torch.as_tensor(lab, dtype=torch.long)
            mask[i, : len(seq)] = 1
        shape = (len(rows), 2, width)
        return {
            "input_ids": ids.view(shape),
            "attention_mask": mask.view(shape),
            "labels": labels.view(shape),
            "num_response_tokens": (labels != IGNORE).sum(),
        }


class PreferenceDataModule(InstructionDataModule):
    """``{prompt|messages, chosen, rejected}`` rows for DPO; arguments as
    ``InstructionDataModule`` (``packing`` must stay false)."""

    cache_kind = "preferences"

    def __init__(self, *args: Any, packing: bool = False, **kwargs: Any) -> None:
        if packing:
            raise ValueError(
                "data.packing=true packs several examples into one row, but a preference pair's "
                "two answers must each see only their prompt: set data.packing=false"
            )
        super().__init__(*args, packing=False, **kwargs)

    def _cache_key(self, files: dict[str, Path] | None) -> str:
        return f"{super()._cache_key(files)}-pairs{PAIR_CACHE_VERSION}"

    def _read(self, files: dict[str, Path] | None) -> dict[str, list[tuple[str, Any, Any]]]:
        return read_preferences(files, self.system_prompt, self.group_column, self.encoding)

    def _bad_rows(self, bad: list[tuple[str, str]], total: int) -> Exception:
        return bad_preference_rows(bad, total)

    def _features(self) -> Any:
        return _pair_features()

    def _load_tokenizer(self) -> Any:
        """The tokenizer, remembering whether it came with a chat template of its own (before
        ``prepare_chat_tokenizer`` gives it the default Llama-3 one)."""
        if self.tokenizer_name is None:
            self._own_template = True  # the offline tokenizer is built with its template
            return super()._load_tokenizer()
        raw = load_tokenizer(self.tokenizer_name)
        self._own_template = bool(raw.chat_template)
        return prepare_chat_tokenizer(raw)

    def _check_template(self, rows: list[tuple[str, Any, Any]]) -> None:
        """Conversations need the base's own chat template: the default one is a guess at how a
        base formats earlier turns. A one-turn prompt is formatted the same way by either."""
        if getattr(self, "_own_template", True):
            return
        for where, (prompt, _, _), _ in rows:
            turns = [m for m in prompt if m["role"] != "system"]
            if len(turns) > 1:
                raise DataError(
                    f"{where}: the rows give conversations, but {self.tokenizer_name}'s tokenizer "
                    "has no chat template of its own: use a base that has one (an instruct "
                    "model), or give one-turn rows {prompt, chosen, rejected}"
                )

    def _encode(
        self, tokenizer: Any, rows: list[tuple[str, Any, Any]], bad: list[tuple[str, str]]
    ) -> tuple[dict[str, list], int]:
        self._check_template(rows)
        eot = end_of_turn(tokenizer)
        out: dict[str, list] = {k: [] for k in _pair_features()}
        truncated = 0
        for where, (prompt, chosen, rejected), _ in rows:
            pair = {}
            for side, answer in (("chosen", chosen), ("rejected", rejected)):
                messages = [*prompt, {"role": "assistant", "content": answer}]
                pieces = segment_texts(tokenizer, messages, eot)
                ids_list = _ids(tokenizer, [t for t, _ in pieces])
                if len(ids_list[-1]) >= self.max_length:
                    bad.append(
                        (where, f"{side} alone {len(ids_list[-1])} tokens, data.max_length "
                                f"{self.max_length}")
                    )  # fmt: skip
                    break
                ids, labels, cut = _join(ids_list, [r for _, r in pieces], self.max_length)
                truncated += cut
                pair[side] = (ids, labels)
            else:
                for side in ("chosen", "rejected"):
                    out[f"{side}_ids"].append(pair[side][0])
                    out[f"{side}_labels"].append(pair[side][1])
                out["length"].append(max(len(pair["chosen"][0]), len(pair["rejected"][0])))
        return out, truncated

    def token_count(self, split: str = "train") -> tuple[int, int]:
        """(real tokens, tokens after padding) for one epoch: two sequences per pair."""
        ds, lengths = self.items(split)
        real_by_row = [len(c) + len(r) for c, r in zip(ds["chosen_ids"], ds["rejected_ids"])]
        real = padded = 0
        for batch in self._loader(split).batch_sampler:
            real += sum(real_by_row[i] for i in batch)
            padded += (
                2
                * padded_length(max(lengths[i] for i in batch), self.pad_to_multiple_of)
                * len(batch)
            )
        return real, padded

    def _collate(self) -> PairCollator:  # type: ignore[override]
        return PairCollator(int(self.tokenizer.pad_token_id), self.pad_to_multiple_of)
