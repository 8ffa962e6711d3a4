"""Prompts for GRPO: rendered with the chat template's generation prompt, cached once, batched
left-padded with the rows' other columns (the rewards read them).

``PromptDataModule`` is ``InstructionDataModule`` with other rows (``prompt_rows``) and other
examples: a cached example is the generation-prompt ids (``render_prompt``'s: the same ids a LoRA
run trains on and ``laptrain generate`` sends), the prompt text the rewards see and the other
columns as JSON. A prompt must leave ``max_new_tokens`` of ``max_length`` to its completion.
Batches are length-grouped, seeded and resumable like the other kinds; ``repeat`` serves each
training batch that many times in a row (``model.num_iterations``: several policy updates on one
rollout, TRL's ``RepeatSampler``).

``build_stdlib_prompts`` makes the offline prompt set (conf/data/stdlib_prompts.yaml).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from laptrain.data.sampler import LengthGroupedBatchSampler
from laptrain.families.classifier.stdlib_docstrings import write_jsonl
from laptrain.families.lora.instructions import InstructionDataModule, render_prompt
from laptrain.families.lora.prompt_rows import (
    PromptRow,
    bad_prompt_rows,
    read_prompts,
    rows_missing_columns,
)
from laptrain.families.lora.stdlib_instructions import collect_pairs

PROMPT_CACHE_VERSION = 2
_NAME = re.compile(r"`([\w.]+)`")


def build_stdlib_prompts(
    cache_dir: str, modules: list[str], min_chars: int = 12, max_chars: int = 200, options: int = 4
) -> dict[str, str]:
    """Write the offline prompt rows to ``<cache_dir>/stdlib_prompts/<key>.jsonl`` once and return
    ``{"all": path}``: for each documented stdlib function or class, its docstring's first
    sentence and the question which of ``options`` names of its module it describes (the name and
    others of the same module, in a shuffled order fixed by the name); ``answer`` is the bare name
    (``dumps``), ``options`` the names offered, ``module`` the module. A module with fewer than two
    names gives no rows."""
    spec = json.dumps(
        {"python": sys.version, "modules": [str(m) for m in modules],
         "chars": [min_chars, max_chars], "options": options, "version": PROMPT_CACHE_VERSION},
        sort_keys=True,
    )  # fmt: skip
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    out = Path(cache_dir) / "stdlib_prompts" / f"{key}.jsonl"
    if not out.exists():
        named = []
        for pair in collect_pairs([str(m) for m in modules], min_chars, max_chars):
            found = _NAME.search(pair["prompt"])
            if found is not None:
                named.append((pair, found.group(1).rpartition(".")[2]))
        names: dict[str, set[str]] = {}
        for pair, name in named:
            names.setdefault(pair["module"], set()).add(name)
        rows = []
        for pair, name in named:
            others = sorted(names[pair["module"]] - {name})
            if not others:
                continue
            pick = random.Random(f"{pair['module']}.{name}")  # str seeds hash the same every run
            offered = [name, *pick.sample(others, min(options - 1, len(others)))]
            pick.shuffle(offered)
            rows.append(
                {"prompt": f"Which `{pair['module']}` function does this: {pair['response']}\n"
                           f"Options: {', '.join(offered)}.\nAnswer with its name only.",
                 "answer": name, "options": offered, "module": pair["module"]}
            )  # fmt: skip
        if not rows:
            raise FileNotFoundError(
                f"no prompts from {', '.join(map(str, modules))}: this Python ships without the "
                "sources of these modules"
            )
        write_jsonl(out, rows)
    return {"all": str(out)}


def _prompt_features() -> Any:
    import datasets

    return datasets.Features(
        {"prompt_ids": datasets.List(datasets.Value("int32")), "prompt": datasets.Value("string"),
         "columns": datasets.Value("string"), "length": datasets.Value("int32")}
    )  # fmt: skip


class NumberedRows(Dataset):
    """A split's rows, each with its position in the split (``row``): GRPO seeds the prompt's
    sampling from it (``grpo_sampling.prompt_generators``)."""

    def __init__(self, rows: Any) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {**self.rows[i], "row": i}


@dataclass
class PromptCollator:
    """``prompt_ids``/``attention_mask`` left-padded to one width (generation appends on the
    right), ``prompts`` (texts), ``columns`` (name -> list, one value per row) and ``rows`` (their
    positions in the split)."""

    pad_token_id: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        width = max(len(r["prompt_ids"]) for r in rows)
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            n = len(r["prompt_ids"])
            ids[i, width - n :] = torch.as_tensor(r["prompt_ids"], dtype=torch.long)
            mask[i, width - n :] = 1
        values = [json.loads(r["columns"]) for r in rows]
        names = sorted({k for v in values for k in v})
        return {
            "prompt_ids": ids,
            "attention_mask": mask,
            "prompts": [r["prompt"] for r in rows],
            "columns": {k: [v.get(k) for v in values] for k in names},
            "rows": [r["row"] for r in rows],
        }


class RepeatedBatches(LengthGroupedBatchSampler):
    """``batches``' order with each batch served ``repeat`` times in a row."""

    def __init__(self, batches: LengthGroupedBatchSampler, repeat: int) -> None:
        self.__dict__.update(vars(batches))
        self.repeat = repeat

    def batches(self) -> list[list[int]]:
        return [b for b in super().batches() for _ in range(self.repeat)]

    def __len__(self) -> int:
        return super().__len__() * self.repeat


class PromptDataModule(InstructionDataModule):
    """``{prompt|messages, ...columns}`` rows for GRPO.

    Args:
        max_new_tokens: the completion's room (``model.max_new_tokens``): a prompt may take
            ``max_length - max_new_tokens`` tokens.
        rewards: ``model.rewards``: every row must hold the columns they read.
        repeat: serve each training batch this many times (``model.num_iterations``).
        Others as ``InstructionDataModule`` (``packing`` must stay false).
    """

    cache_kind = "prompts"

    def __init__(
        self,
        *args: Any,
        max_new_tokens: int = 64,
        rewards: list[Any] | None = None,
        repeat: int = 1,
        packing: bool = False,
        **kwargs: Any,
    ) -> None:
        if packing:
            raise ValueError("data.packing=true has no meaning for prompts: set data.packing=false")
        super().__init__(*args, packing=False, **kwargs)
        if not 0 < max_new_tokens < self.max_length:
            raise ValueError(
                f"model.max_new_tokens={max_new_tokens} must be between 1 and data.max_length - 1 "
                f"({self.max_length - 1})"
            )
        self.max_new_tokens, self.rewards, self.repeat = int(max_new_tokens), rewards, int(repeat)

    def _cache_key(self, files: dict[str, Path] | None) -> str:
        return f"{super()._cache_key(files)}-prompts{PROMPT_CACHE_VERSION}-{self.max_new_tokens}"

    def _read(self, files: dict[str, Path] | None) -> dict[str, list[tuple[str, PromptRow, Any]]]:
        named = read_prompts(files, self.system_prompt, self.group_column, self.encoding)
        bad = rows_missing_columns(named, self.rewards)
        if bad:
            raise bad_prompt_rows(bad, sum(len(rows) for rows in named.values()))
        return named

    def _bad_rows(self, bad: list[tuple[str, str]], total: int) -> Exception:
        return bad_prompt_rows(bad, total)

    def _features(self) -> Any:
        return _prompt_features()

    def _encode(
        self, tokenizer: Any, rows: list[tuple[str, PromptRow, Any]], bad: list[tuple[str, str]]
    ) -> tuple[dict[str, list], int]:
        room = self.max_length - self.max_new_tokens
        out: dict[str, list] = {k: [] for k in _prompt_features()}
        for where, row, _ in rows:
            ids = render_prompt(tokenizer, row.messages)
            if len(ids) > room:
                bad.append(
                    (where, f"prompt {len(ids)} tokens, data.max_length {self.max_length} - "
                            f"model.max_new_tokens {self.max_new_tokens} leaves {room}")
                )  # fmt: skip
                continue
            out["prompt_ids"].append(ids)
            out["prompt"].append(row.text)
            out["columns"].append(json.dumps(row.columns, sort_keys=True, default=str))
            out["length"].append(len(ids))
        return out, 0

    def token_count(self, split: str = "train") -> tuple[int, int]:
        """(prompt tokens, prompt tokens after left-padding each batch) for one epoch."""
        _, lengths = self.items(split)
        real = padded = 0
        for batch in self._loader(split).batch_sampler:
            real += sum(lengths[i] for i in batch)
            padded += max(lengths[i] for i in batch) * len(batch)
        return real, padded

    def _grouped_loader(self, split: str, ds: Any, lengths: Any) -> DataLoader:
        loader = super()._grouped_loader(split, NumberedRows(ds), lengths)
        if split != "train" or self.repeat == 1:
            return loader
        workers: dict[str, Any] = {}
        if loader.num_workers:
            workers = {
                "persistent_workers": loader.persistent_workers,
                "prefetch_factor": loader.prefetch_factor,
                "worker_init_fn": loader.worker_init_fn,
                "multiprocessing_context": loader.multiprocessing_context,
            }
        return type(loader)(
            loader.dataset,
            batch_sampler=RepeatedBatches(loader.batch_sampler, self.repeat),
            collate_fn=loader.collate_fn,
            num_workers=loader.num_workers,
            pin_memory=loader.pin_memory,
            generator=loader.generator,
            **workers,
        )

    def _collate(self) -> PromptCollator:  # type: ignore[override]
        return PromptCollator(int(self.tokenizer.pad_token_id))
