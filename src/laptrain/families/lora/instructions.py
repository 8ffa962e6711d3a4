"""Instruction data for causal-LM fine-tuning: chat-rendered, loss only on the responses.

Rows are ``{prompt, response}``, ``{prompt, completion}`` or ``{messages: [{role, content}, ...]}``
(roles system / user / assistant) in JSONL, JSON, CSV/TSV or Parquet; or TRL's language-modeling
``{text}`` rows, one response segment each: the text + EOS with the tokenizer's own BOS, no chat
template, every token trained (TRL's SFTTrainer on a "text" dataset). Each chat row becomes segments,
each tokenized on its own: the chat rendered up to an assistant turn with the generation prompt
(label -100), then that turn's content + end-of-turn (labels = ids), and so on for every assistant
turn. Not one rendering of the whole chat masked afterwards: with a byte-level BPE the header's
"\\n\\n" merges differently before text than at the end of a prompt, so a mask over one rendering
trains on ids that generation never sees (the tiny model reproduced 0/8 memorised answers that
way, 8/8 with segments; measured). ``render_prompt`` builds generation prompts from the same
segments, so they equal the training prefix id for id.

Too long: the prompt is cut from the left, the response is kept (a text row loses its end, as in
TRL); the count is logged. The
tokenized splits are cached like ``TextClassificationDataModule``'s (whose file handling, split
and batch plumbing this module inherits); batches are length-grouped, seeded and resumable, padded
to a multiple of ``pad_to_multiple_of`` (64 on MPS profiles: every new shape builds an MPSGraph
that torch keeps, pytorch#121113, transformers#33717). ``packing`` puts several examples in a row
with a block-diagonal causal 4D mask and restarting ``position_ids`` (position ids alone let sdpa
attend across examples; measured logit difference 0.51, 1.8e-7 with the mask).
"""

from __future__ import annotations

import bisect
import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader, Dataset

from laptrain.data.collate import PadCollator, padded_length
from laptrain.families.classifier.text_classification import (
    TextClassificationDataModule,
    building,
    publish_entry,
)
from laptrain.families.classifier.tokenizer import load_tokenizer, tokenizer_fingerprint
from laptrain.families.lora.chat_tokenizer import (
    LLAMA3_CHAT_TEMPLATE,
    offline_tokenizer,
    offline_tokenizer_path,
    prepare_chat_tokenizer,
)
from laptrain.families.lora.instruction_rows import (
    Messages,
    PlainText,
    bad_rows_error,
    read_instructions,
    split_instruction_rows,
    to_messages,
)
from laptrain.files import file_digest

IGNORE = -100  # the label cross-entropy skips (torch's default ignore_index)
CACHE_VERSION = 1
_SENTINEL = "laptrain-response-sentinel"

# ---- rendering ---------------------------------------------------------------------------------


def _template(tokenizer: Any) -> str:
    return tokenizer.chat_template or LLAMA3_CHAT_TEMPLATE


def _render(tokenizer: Any, messages: Messages, add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        messages,
        chat_template=_template(tokenizer),
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )


def end_of_turn(tokenizer: Any) -> str:
    """The text the chat template writes after an assistant turn (``<|eot_id|>`` for Llama 3,
    ``<|im_end|>`` for ChatML), trailing whitespace dropped; EOS when the template writes none."""
    probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
    text = _render(tokenizer, probe, add_generation_prompt=False)
    tail = text.split(_SENTINEL, 1)[1].rstrip() if _SENTINEL in text else ""
    return tail or tokenizer.eos_token


def _after(text: str, done: str) -> str:
    if not text.startswith(done):
        raise ValueError(
            "this tokenizer's chat template renders earlier turns differently once later turns "
            "are added, so turns cannot be tokenized as segments: use a tokenizer whose template "
            "only appends (data.tokenizer=...), or set its chat_template"
        )
    return text[len(done) :]


def segment_texts(
    tokenizer: Any, messages: Messages | PlainText, eot: str, add_generation_prompt: bool = False
) -> list[tuple[str, bool]]:
    """``(text, is_response)`` pieces whose concatenation is the rendered chat.

    Every assistant turn is one response piece (content + ``eot``); everything between is one
    prompt piece, ending with the assistant header (the generation prompt). Messages after the last
    assistant turn are dropped unless ``add_generation_prompt`` asks for the next prompt. A text
    row is one response piece: TRL's ``text + eos_token`` (unless it ends so) after the BOS the
    tokenizer adds by itself (TRL tokenizes it with the special tokens).
    """
    if isinstance(messages, PlainText):
        eos = tokenizer.eos_token or ""
        text = messages.text if messages.text.endswith(eos) else messages.text + eos
        return [(_own_bos(tokenizer) + text, True)]
    pieces: list[tuple[str, bool]] = []
    done = ""
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = _after(_render(tokenizer, messages[:i], True), done)
        response = message["content"] + eot
        pieces += [(prompt, False), (response, True)]
        done += prompt + response
    if add_generation_prompt and (not messages or messages[-1]["role"] != "assistant"):
        pieces.append((_after(_render(tokenizer, messages, True), done), False))
    return pieces


def _own_bos(tokenizer: Any) -> str:
    bos = tokenizer.bos_token_id
    return (
        tokenizer.bos_token if bos is not None and tokenizer("")["input_ids"][:1] == [bos] else ""
    )


def _ids(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def render_prompt(
    tokenizer: Any, messages_or_prompt: str | Messages, system_prompt: str | None = None
) -> list[int]:
    """Generation prompt ids: equal to the training prefix of the same prompt (or conversation)."""
    messages = to_messages(messages_or_prompt, system_prompt)
    if messages and messages[-1]["role"] == "assistant":
        raise ValueError("the conversation to continue must end with a user (or system) turn")
    pieces = segment_texts(tokenizer, messages, end_of_turn(tokenizer), add_generation_prompt=True)
    return [i for ids in _ids(tokenizer, [t for t, _ in pieces]) for i in ids]


def encode_chat(
    tokenizer: Any,
    messages: Messages | PlainText,
    max_length: int | None = None,
    eot: str | None = None,
) -> tuple[list[int], list[int], bool]:
    """``(input_ids, labels, truncated)`` of one conversation (or text row); labels are -100 off
    the responses.

    Longer than ``max_length``: tokens are cut from the left, so the last response is kept whole
    (the caller checks that it fits, see ``_check_response``); a text row loses its end instead.
    """
    pieces = segment_texts(tokenizer, messages, eot or end_of_turn(tokenizer))
    ids_list = _ids(tokenizer, [t for t, _ in pieces])
    return _join(ids_list, [r for _, r in pieces], max_length)


def _join(
    ids_list: Sequence[list[int]], is_response: Sequence[bool], max_length: int | None
) -> tuple[list[int], list[int], bool]:
    ids: list[int] = []
    labels: list[int] = []
    for piece, response in zip(ids_list, is_response, strict=True):
        ids += piece
        labels += piece if response else [IGNORE] * len(piece)
    truncated = max_length is not None and len(ids) > max_length
    if truncated:
        keep = slice(max_length) if len(ids_list) == 1 else slice(-max_length, None)
        ids, labels = ids[keep], labels[keep]
    if labels:
        labels[0] = IGNORE  # nothing predicts the first token (counts stay exact after a cut)
    return ids, labels, truncated


# ---- batches -----------------------------------------------------------------------------------


def padded_examples(
    examples: Sequence[tuple[list[int], list[int]]],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(input_ids, attention_mask, labels)`` of ``(ids, labels)`` examples, right-padded with 0
    and -100 to the longest: the evaluation tools' batches (training batches come from the
    collators below)."""
    width = max(len(ids) for ids, _ in examples)
    ids = torch.zeros((len(examples), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, IGNORE)
    for i, (row_ids, row_labels) in enumerate(examples):
        ids[i, : len(row_ids)] = torch.tensor(row_ids)
        mask[i, : len(row_ids)] = 1
        labels[i, : len(row_labels)] = torch.tensor(row_labels)
    return ids, mask, labels


def block_causal_mask(
    lengths: Sequence[Sequence[int]], width: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mask [B,1,T,T], position_ids [B,T])`` for rows holding several examples each.

    ``lengths[b]`` are the example lengths packed into row ``b``. The mask is additive (0 = attend,
    dtype's minimum = not): causal within an example, nothing across. Padding forms one more block
    so that no row is fully masked. transformers' masking_utils passes a 4D mask through unchanged.
    """
    segment = torch.empty((len(lengths), width), dtype=torch.long)
    positions = torch.empty((len(lengths), width), dtype=torch.long)
    for b, row in enumerate(lengths):
        parts = [*row, width - sum(row)] if sum(row) < width else list(row)
        segment[b] = torch.repeat_interleave(torch.arange(len(parts)), torch.tensor(parts))
        positions[b] = torch.cat([torch.arange(n) for n in parts])
    causal = torch.ones((width, width), dtype=torch.bool).tril()
    allowed = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return mask[:, None], positions


@dataclass
class CausalLMCollator:
    """Right-padded ``input_ids``/``attention_mask`` (``PadCollator``), ``labels`` padded with -100,
    ``num_response_tokens`` (labels != -100 in the batch, for normalising the loss over an optimizer
    step), and with ``packed`` the 4D block-causal mask and restarting ``position_ids``."""

    pad_token_id: int
    pad_to_multiple_of: int | None = None
    packed: bool = False

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        pad = PadCollator(self.pad_token_id, self.pad_to_multiple_of)
        batch = pad([{"input_ids": r["input_ids"]} for r in rows])
        labels = torch.full(batch["input_ids"].shape, IGNORE, dtype=torch.long)
        for i, r in enumerate(rows):
            labels[i, : len(r["labels"])] = torch.as_tensor(r["labels"], dtype=torch.long)
        batch["labels"] = labels
        batch["num_response_tokens"] = (labels != IGNORE).sum()
        if self.packed:
            width = batch["input_ids"].shape[1]
            lengths = [r.get("lengths", [len(r["input_ids"])]) for r in rows]
            batch["attention_mask"], batch["position_ids"] = block_causal_mask(lengths, width)
        return batch


def pack(lengths: Sequence[int], max_length: int) -> list[list[int]]:
    """Indices grouped into rows of at most ``max_length`` tokens (best-fit decreasing; seeded
    batching shuffles the rows later, so this order needs no randomness)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    room: list[tuple[int, int]] = []  # (tokens left, row), sorted
    for i in order:
        j = bisect.bisect_left(room, (lengths[i], -1))
        if j == len(room):
            rows.append([i])
            left, row = max_length - lengths[i], len(rows) - 1
        else:
            left, row = room.pop(j)
            rows[row].append(i)
            left -= lengths[i]
        bisect.insort(room, (left, row))
    return rows


class PackedRows(Dataset):
    """Examples of a tokenized split concatenated per ``groups`` row, with their lengths."""

    def __init__(self, examples: Any, groups: list[list[int]]) -> None:
        self.examples, self.groups = examples, groups

    def __len__(self) -> int:
        return len(self.groups)

    def __getitem__(self, index: int) -> dict[str, Any]:
        items = [self.examples[i] for i in self.groups[index]]
        return {
            "input_ids": [t for x in items for t in x["input_ids"]],
            "labels": [t for x in items for t in x["labels"]],
            "lengths": [len(x["input_ids"]) for x in items],
        }


def _features() -> Any:
    import datasets

    ids = datasets.List(datasets.Value("int32"))
    return datasets.Features({"input_ids": ids, "labels": ids, "length": datasets.Value("int32")})


# ---- the data module ---------------------------------------------------------------------------


class InstructionDataModule(TextClassificationDataModule):
    """Prompt/response or chat rows, tokenized once into masked causal-LM examples and cached.

    Args:
        files: split name -> file (``train``, ``validation``/``val``, ``test``, or ``all`` to split).
        builder: a callable returning ``files`` (e.g. the offline stdlib instructions).
        tokenizer: hub name or ``save_pretrained`` folder; ``None`` = the offline byte-level BPE
            (``laptrain.families.lora.chat_tokenizer.offline_tokenizer``) of ``vocab_size`` tokens.
        max_length: longest example; longer ones lose prompt tokens from the left (text rows
            their end).
        group_column: rows sharing this field's value stay in one split (stdlib: the module).
        system_prompt: a system turn for rows that have none.
        pad_to_multiple_of: batch widths rounded up to a multiple (64 on MPS profiles).
        packing: several examples per row up to ``max_length`` (4D block-causal mask).
        Others as ``TextClassificationDataModule``.
    """

    def __init__(
        self,
        files: dict[str, str] | None = None,
        builder: Callable[[], dict[str, str]] | None = None,
        tokenizer: str | Mapping[str, Any] | None = None,
        vocab_size: int = 2048,
        max_length: int = 512,
        group_column: str | None = None,
        system_prompt: str | None = None,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 42,
        folds: int | None = None,
        fold: int = 0,
        encoding: str = "utf-8",
        batch_size: int | None = 8,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        group_by_length: bool = True,
        pad_to_multiple_of: int | None = None,
        packing: bool = False,
        seed: int = 42,
        cache_dir: str = ".cache/laptrain",
    ) -> None:
        super().__init__(
            files=files,
            builder=builder,
            group_column=group_column,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            max_length=max_length,
            val_fraction=val_fraction,
            test_fraction=test_fraction,
            split_seed=split_seed,
            folds=folds,
            fold=fold,
            encoding=encoding,
            batch_size=batch_size,
            eval_batch_size=eval_batch_size,
            num_workers=num_workers,
            pin_memory=pin_memory,
            persistent_workers=persistent_workers,
            prefetch_factor=prefetch_factor,
            group_by_length=group_by_length,
            pad_to_multiple_of=pad_to_multiple_of,
            seed=seed,
            cache_dir=cache_dir,
        )
        self.system_prompt, self.packing = system_prompt, bool(packing)
        self.truncated: dict[str, int] = {}
        self._items: dict[str, tuple[Any, list[int]]] = {}

    cache_kind = "instructions"  # the cache folder of this kind of rows

    # ---- building the cache ------------------------------------------------------------------

    def _tokenizer_spec(self) -> Any:
        if self.tokenizer_name is None:  # the offline tokenizer's key is in its folder's name
            return offline_tokenizer_path(self.cache_dir, self.vocab_size).name
        return tokenizer_fingerprint(self.tokenizer_name)

    def _cache_key(self, files: dict[str, Path] | None) -> str:
        spec = {
            "version": CACHE_VERSION,
            "files": {k: file_digest(v) for k, v in (files or {}).items()},
            "group": self.group_column,
            "split": [self.val_fraction, self.test_fraction, self.split_seed],
            **({"folds": [self.folds, self.fold]} if self.folds else {}),
            "tokenizer": self._tokenizer_spec(),
            "max_length": self.max_length,
            "system_prompt": self.system_prompt,
            "encoding": self.encoding,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]

    def _load_tokenizer(self) -> Any:
        if self.tokenizer_name is None:
            return offline_tokenizer(self.cache_dir, self.vocab_size)
        return prepare_chat_tokenizer(load_tokenizer(self.tokenizer_name))

    def _read(self, files: dict[str, Path] | None) -> dict[str, list[tuple[str, Any, Any]]]:
        """``split -> [(file:line, row, group)]``; one error naming the bad rows."""
        return read_instructions(files, self.system_prompt, self.group_column, self.encoding)

    def _bad_rows(self, bad: list[tuple[str, str]], total: int) -> Exception:
        return bad_rows_error(bad, total)

    def _features(self) -> Any:
        return _features()

    def _split_rows(self, named: dict[str, list[tuple[str, Messages, Any]]]) -> dict[str, list]:
        return split_instruction_rows(
            named, self.val_fraction, self.test_fraction, self.split_seed, self.folds, self.fold
        )

    def _encode(
        self, tokenizer: Any, rows: list[tuple[str, Messages, Any]], bad: list[tuple[str, str]]
    ) -> tuple[dict[str, list], int]:
        eot = end_of_turn(tokenizer)
        pieces = [segment_texts(tokenizer, messages, eot) for _, messages, _ in rows]
        flat = _ids(tokenizer, [t for p in pieces for t, _ in p])
        out: dict[str, list] = {"input_ids": [], "labels": [], "length": []}
        truncated = start = 0
        for (where, _, _), p in zip(rows, pieces, strict=True):
            ids_list, start = flat[start : start + len(p)], start + len(p)
            last = len(ids_list[-1])
            if len(p) > 1 and last >= self.max_length:  # the prompt needs one token at least
                bad.append(
                    (where, f"response alone {last} tokens, data.max_length {self.max_length}")
                )
                continue
            ids, labels, cut = _join(ids_list, [r for _, r in p], self.max_length)
            truncated += cut
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            out["length"].append(len(ids))
        return out, truncated

    def prepare_data(self) -> None:
        """Build the tokenized cache entry unless a complete one is there (tmp folder, sealed
        with checksums, then renamed: ``laptrain.families.classifier.text_classification.publish_entry``)."""
        if self.entry is not None and self._ready == self.entry:
            return
        files = self._resolve_files()
        entry = self.cache_dir / self.cache_kind / self._cache_key(files)
        self.entry = entry
        if self._entry_ready(entry):
            return
        named = self._read(files)
        bad: list[tuple[str, str]] = []
        total = sum(len(rows) for rows in named.values())
        splits = self._split_rows(named)
        tokenizer = self._load_tokenizer()
        encoded, truncated = {}, {}
        for split, rows in splits.items():
            encoded[split], truncated[split] = self._encode(tokenizer, rows, bad)
        if bad:
            raise self._bad_rows(bad, total)

        import datasets

        datasets.disable_progress_bars()
        with building(entry) as tmp:
            tmp.mkdir()
            for split, columns in encoded.items():
                if columns["length"]:  # datasets cannot load an empty split back; setup makes it
                    datasets.Dataset.from_dict(columns, features=self._features()).save_to_disk(
                        str(tmp / split)
                    )
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
            sizes = {k: len(v["length"]) for k, v in encoded.items()}
            publish_entry(tmp, entry, {"sizes": sizes, "truncated": truncated})
        self._ready = entry

    # ---- using it -----------------------------------------------------------------------------

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        import datasets
        from transformers import AutoTokenizer

        meta = self.read_meta()
        self.splits = {
            s: datasets.load_from_disk(str(self.entry / s))
            if (self.entry / s).is_dir()
            else datasets.Dataset.from_dict(
                {k: [] for k in self._features()}, features=self._features()
            )
            for s in ("train", "val", "test")
        }
        self.tokenizer = prepare_chat_tokenizer(
            AutoTokenizer.from_pretrained(str(self.entry / "tokenizer"))
        )
        self.truncated = {s: int(n) for s, n in meta["truncated"].items()}
        if any(self.truncated.values()):
            counts = ", ".join(
                f"{self.truncated[s]} of {meta['sizes'][s]} {s}" for s in ("train", "val", "test")
            )
            rank_zero_info(  # every rank of a torchrun job sets up its data; one line is enough
                f"instructions: {counts} rows were longer than data.max_length="
                f"{self.max_length}: their prompts were cut from the left, responses kept "
                "(text rows lost their ends)"
            )

    def model_kwargs(self) -> dict[str, Any]:
        """The model gets the tokenizer (pad set, chat template set; never resized)."""
        self.setup()
        return {"tokenizer": self.tokenizer}

    def save_artifacts(self, folder: str | Path) -> None:
        """Keep the tokenizer (with its chat template) with the run."""
        self.setup()
        self.tokenizer.save_pretrained(str(Path(folder) / "tokenizer"))

    def items(self, split: str) -> tuple[Any, list[int]]:
        """The split's dataset as the loader sees it (packed rows when ``packing``) and the
        token count of each item."""
        if split not in self._items:
            self.setup()
            ds = self.splits[split]
            lengths = [int(n) for n in ds["length"]]
            if self.packing:
                groups = pack(lengths, self.max_length)
                ds = PackedRows(ds, groups)
                lengths = [sum(lengths[i] for i in g) for g in groups]
            self._items[split] = (ds, lengths)
        return self._items[split]

    def longest_example(self, split: str = "train") -> int:
        """Tokens in the longest item of ``split`` (a packed row when ``packing``) once padded to
        ``pad_to_multiple_of``: the widest batch an epoch can hold
        (``laptrain.data.contracts.KnowsLengths``)."""
        _, lengths = self.items(split)
        return padded_length(max(lengths, default=0), self.pad_to_multiple_of)

    def token_count(self, split: str = "train") -> tuple[int, int]:
        """(real tokens, tokens after padding each batch) for one epoch of ``split`` as batched now."""
        _, lengths = self.items(split)
        loader = self._loader(split)
        real = padded = 0
        for batch in loader.batch_sampler:
            ls = [lengths[i] for i in batch]
            real += sum(ls)
            padded += padded_length(max(ls), self.pad_to_multiple_of) * len(ls)
        return real, padded

    def _loader(self, split: str) -> DataLoader:
        self._need_batch_size()  # before items(), which may build the cache
        ds, lengths = self.items(split)
        return self._grouped_loader(split, ds, lengths)

    def _collate(self) -> CausalLMCollator:
        return CausalLMCollator(
            int(self.tokenizer.pad_token_id), self.pad_to_multiple_of, self.packing
        )
