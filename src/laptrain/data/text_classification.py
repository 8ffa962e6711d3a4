"""Text classification data: local CSV / JSONL / Parquet or a hub dataset, tokenized once and cached.

The expensive work (reading, splitting, fitting or loading a tokenizer, tokenizing) happens once per
(data, columns, split, tokenizer, max length) and is stored under ``cache_dir/tokenized/<key>/``;
a second run with the same inputs memory-maps the result. Batches are padded per batch and grouped
by length (``laptrain.data.sampler``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from laptrain.data.collate import PadCollator
from laptrain.data.sampler import LengthGroupedBatchSampler, ResumableDataLoader
from laptrain.data.splits import assign_splits
from laptrain.data.tokenizer import load_tokenizer, train_wordpiece

FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
SPLIT_ALIASES = {"train": "train", "validation": "val", "val": "val", "dev": "val", "test": "test"}
CACHE_VERSION = 2  # 2: stratified split


def publish_entry(tmp: Path, entry: Path) -> None:
    """Move a finished cache folder into place, unless another process finished first."""
    if entry.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        tmp.rename(entry)


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(
            f"batch size must be >= 1 (got {batch_size}): set hardware.batch_size=<n> "
            "or pick another hardware profile"
        )


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class TextClassificationDataModule(pl.LightningDataModule):
    """Texts with one label each, split into train / val / test.

    Args:
        files: split name -> file (``train``, ``validation``/``val``, ``test``, or ``all`` to split).
        hub_name, hub_config: a Hugging Face dataset name, used instead of ``files`` when online.
        builder: a callable returning ``files`` (e.g. the offline stdlib-docstrings corpus).
        text_column, label_column: column names in the files.
        group_column: split so that rows sharing this column's value stay in one split.
        label_names: fixed label order; default = sorted labels found in train.
        tokenizer: pretrained name or folder; ``None`` trains a WordPiece of ``vocab_size``.
        max_length: longest sequence kept (truncation); batches are padded only to their longest.
        val_fraction, test_fraction, split_seed: used when the files do not give those splits.
        group_by_length: batch similar lengths together (seeded, resumable); false = random batches.
    """

    def __init__(
        self,
        files: dict[str, str] | None = None,
        hub_name: str | None = None,
        hub_config: str | None = None,
        builder: Callable[[], dict[str, str]] | None = None,
        text_column: str = "text",
        label_column: str = "label",
        group_column: str | None = None,
        label_names: list[str] | None = None,
        tokenizer: str | None = None,
        vocab_size: int = 8000,
        max_length: int = 256,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 42,
        batch_size: int | None = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        prefetch_factor: int | None = None,
        group_by_length: bool = True,
        pad_to_multiple_of: int | None = None,
        seed: int = 42,
        cache_dir: str = ".cache/laptrain",
    ) -> None:
        super().__init__()
        _check_batch_size(batch_size)
        if max_length < 8:
            raise ValueError(f"data.max_length must be >= 8 (got {max_length})")
        if not (
            0 <= val_fraction < 1 and 0 <= test_fraction < 1 and val_fraction + test_fraction < 1
        ):
            raise ValueError("data.val_fraction + data.test_fraction must be below 1")
        self.files = dict(files) if files else None
        self.hub_name, self.hub_config, self.builder = hub_name, hub_config, builder
        self.text_column, self.label_column, self.group_column = (
            text_column,
            label_column,
            group_column,
        )
        self.fixed_label_names = list(label_names) if label_names else None
        self.tokenizer_name, self.vocab_size, self.max_length = tokenizer, vocab_size, max_length
        self.val_fraction, self.test_fraction, self.split_seed = (
            val_fraction,
            test_fraction,
            split_seed,
        )
        # None: decided by the run plan, which passes it through with_batch_sizes
        self.batch_size = int(batch_size) if batch_size is not None else None
        self.eval_batch_size = (
            int(eval_batch_size or batch_size) if (eval_batch_size or batch_size) else None
        )
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers, self.prefetch_factor = persistent_workers, prefetch_factor
        self.group_by_length, self.pad_to_multiple_of, self.seed = (
            group_by_length,
            pad_to_multiple_of,
            seed,
        )
        self.cache_dir = Path(cache_dir)
        self.entry: Path | None = None
        self.splits: dict[str, Any] = {}
        self.label_names: list[str] = []
        self.tokenizer: Any = None

    def with_batch_sizes(
        self, batch_size: int, eval_batch_size: int | None = None
    ) -> TextClassificationDataModule:
        """This datamodule (its prepared data shared) with the run plan's batch sizes."""
        _check_batch_size(batch_size)
        planned = copy.copy(self)
        planned.batch_size = int(batch_size)
        planned.eval_batch_size = int(eval_batch_size or batch_size)
        return planned

    # ---- building the cache ------------------------------------------------------------------

    def _resolve_files(self) -> dict[str, Path]:
        files = self.files or (self.builder() if self.builder else None)
        if not files:
            raise ValueError(
                "no data given: set data.files.train=<file> (csv/jsonl/parquet) or data.hub_name"
            )
        out: dict[str, Path] = {}
        for split, name in files.items():
            if split not in SPLIT_ALIASES and split != "all":
                raise ValueError(
                    f"unknown split {split!r} in data.files: use train, validation, test or all"
                )
            path = Path(str(name)).expanduser()
            if not path.is_file():
                raise FileNotFoundError(
                    f"data file not found: {path} (set data.files.{split}=<path to a .csv, .jsonl or .parquet file>)"
                )
            if path.suffix.lower() not in FORMATS:
                raise ValueError(
                    f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(FORMATS)}"
                )
            out[split] = path
        return out

    def _cache_key(self, files: dict[str, Path] | None) -> str:
        spec = {
            "version": CACHE_VERSION,
            "files": {k: _file_digest(v) for k, v in (files or {}).items()},
            "hub": [self.hub_name, self.hub_config],
            "columns": [self.text_column, self.label_column, self.group_column],
            "labels": self.fixed_label_names,
            "split": [self.val_fraction, self.test_fraction, self.split_seed],
            "tokenizer": self.tokenizer_name or f"wordpiece-{self.vocab_size}",
            "max_length": self.max_length,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]

    def _load_raw(self, files: dict[str, Path] | None) -> dict[str, Any]:
        import datasets

        datasets.disable_progress_bars()
        if files is None:
            try:
                raw = datasets.load_dataset(self.hub_name, self.hub_config)
            except Exception as err:
                raise ConnectionError(
                    f"cannot load hub dataset {self.hub_name!r} ({err.__class__.__name__}): "
                    "check data.hub_name and the network, or use data.files.train=<local file>"
                ) from None
            named = {SPLIT_ALIASES.get(k, k): v for k, v in raw.items()}
        else:
            named = {}
            for split, path in files.items():
                kind = FORMATS[path.suffix.lower()]
                kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
                ds = datasets.load_dataset(
                    kind,
                    data_files=str(path),
                    split="train",
                    cache_dir=str(self.cache_dir / "hf"),
                    **kwargs,
                )
                named[SPLIT_ALIASES.get(split, split)] = (ds, path)
        checked = {}
        for split, item in named.items():
            ds, source = item if isinstance(item, tuple) else (item, self.hub_name)
            for key, col in (
                ("text_column", self.text_column),
                ("label_column", self.label_column),
            ):
                if col not in ds.column_names:
                    raise ValueError(
                        f"column {col!r} not in {source} (columns: {', '.join(ds.column_names)}): "
                        f"set data.{key}=<one of them>"
                    )
            if self.group_column and self.group_column not in ds.column_names:
                raise ValueError(
                    f"group column {self.group_column!r} not in {source}: set data.group_column=null"
                )
            checked[split] = ds
        return checked

    def _split(self, named: dict[str, Any]) -> dict[str, Any]:
        base = named.get("train", named.get("all"))
        if base is None:
            raise ValueError("data.files needs a 'train' (or 'all') file")
        splits = {"train": base}
        missing = [s for s in ("val", "test") if s not in named]
        fractions = {"val": self.val_fraction, "test": self.test_fraction}
        if missing:
            groups = base[self.group_column] if self.group_column else range(len(base))
            labels = [str(v) for v in base[self.label_column]]
            where = assign_splits(
                labels, groups, {s: fractions[s] for s in missing}, self.split_seed
            )
            for split in [*missing, "train"]:
                splits[split] = base.select([i for i, w in enumerate(where) if w == split])
        for split in ("val", "test"):
            if split not in splits:
                splits[split] = named[split]
        if len(splits["train"]) == 0 or len(splits["val"]) == 0:
            raise ValueError(
                "the train or validation split is empty: give more rows or raise data.val_fraction"
            )
        return splits

    def _label_names(self, train: Any) -> list[str]:
        if self.fixed_label_names:
            return self.fixed_label_names
        values = train[self.label_column]
        if all(isinstance(v, int) for v in values):
            return [str(i) for i in range(max(values) + 1)]
        return sorted({str(v) for v in values})

    def prepare_data(self) -> None:
        """Build the tokenized cache entry if it is not there yet (atomically: tmp folder, then rename)."""
        if self.entry is not None and (self.entry / "meta.json").exists():
            return  # done earlier in this process: Lightning calls prepare_data again in fit
        files = None if (self.hub_name and not self.files) else self._resolve_files()
        entry = self.cache_dir / "tokenized" / self._cache_key(files)
        self.entry = entry
        if (entry / "meta.json").exists():
            return
        splits = self._split(self._load_raw(files))
        label_names = self._label_names(splits["train"])
        index = {name: i for i, name in enumerate(label_names)}
        texts = [str(t) for t in splits["train"][self.text_column]]
        tokenizer = (
            load_tokenizer(self.tokenizer_name)
            if self.tokenizer_name
            else train_wordpiece(texts, self.vocab_size)
        )
        tmp = entry.with_name(f"{entry.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)

        def label_id(value: Any) -> int:
            """A label by name, or an integer label by position in ``label_names``."""
            if str(value) in index:
                return index[str(value)]
            if isinstance(value, int) and 0 <= value < len(label_names):
                return value
            raise ValueError(
                f"label {value!r} is not in data.label_names ({', '.join(label_names)})"
            )

        def encode(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            ids = tokenizer(
                [str(t) for t in batch[self.text_column]],
                truncation=True,
                max_length=self.max_length,
            )["input_ids"]
            labels = [label_id(v) for v in batch[self.label_column]]
            return {"input_ids": ids, "labels": labels, "length": [len(x) for x in ids]}

        for split, ds in splits.items():
            encoded = ds.map(encode, batched=True, remove_columns=ds.column_names)
            encoded.save_to_disk(str(tmp / split))
        tokenizer.save_pretrained(str(tmp / "tokenizer"))
        meta = {"label_names": label_names, "sizes": {k: len(v) for k, v in splits.items()}}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
        publish_entry(tmp, entry)

    # ---- using it -----------------------------------------------------------------------------

    def read_meta(self) -> dict[str, Any]:
        """The cache entry's meta.json, preparing the entry first if this process has not."""
        if self.entry is None:
            self.prepare_data()
        assert self.entry is not None
        return json.loads((self.entry / "meta.json").read_text())

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        import datasets
        from transformers import AutoTokenizer

        meta = self.read_meta()
        self.label_names = meta["label_names"]
        self.splits = {
            s: datasets.load_from_disk(str(self.entry / s)) for s in ("train", "val", "test")
        }
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.entry / "tokenizer"))

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def model_kwargs(self) -> dict[str, Any]:
        """What the model needs to know about the data (see ``laptrain.run``)."""
        self.setup()
        return {
            "num_labels": self.num_labels,
            "label_names": list(self.label_names),
            "vocab_size": len(self.tokenizer),
            "pad_token_id": int(self.tokenizer.pad_token_id),
        }

    def save_artifacts(self, folder: str | Path) -> None:
        """Keep the tokenizer and the label names with the run, so the trained model is usable."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(str(folder / "tokenizer"))
        (folder / "labels.json").write_text(json.dumps(self.label_names, indent=1))

    def token_count(self, split: str = "train") -> tuple[int, int]:
        """(real tokens, tokens after padding each batch) for one epoch of ``split`` as batched now."""
        loader = self._loader(split)
        lengths = self.splits[split]["length"]
        real = padded = 0
        for batch in loader.batch_sampler:
            ls = [lengths[i] for i in batch]
            real += sum(ls)
            padded += max(ls) * len(ls)
        return real, padded

    def _loader(self, split: str) -> DataLoader:
        ds = self.splits[split]
        train = split == "train"
        if self.batch_size is None:
            raise ValueError(
                "this datamodule has no batch size yet: build it through the run plan "
                "(with_batch_sizes), or set data.batch_size=<n>"
            )
        sampler = LengthGroupedBatchSampler(
            ds["length"],
            self.batch_size if train else self.eval_batch_size,
            seed=self.seed,
            shuffle=train,
            mega_batches=50 if self.group_by_length else 0,
        )
        workers = int(self.num_workers or 0)
        kwargs: dict[str, Any] = {
            "batch_sampler": sampler,
            "collate_fn": PadCollator(int(self.tokenizer.pad_token_id), self.pad_to_multiple_of),
            "num_workers": workers,
            "pin_memory": bool(self.pin_memory),
            # Each new iterator draws a base seed; from a private generator it leaves the global
            # RNG (dropout) alone, so a resumed run's masks match an uninterrupted run's.
            "generator": torch.Generator().manual_seed(self.seed),
        }
        if workers > 0:  # both are errors with workers == 0 (docs/hardware.md §5)
            kwargs["persistent_workers"] = bool(self.persistent_workers)
            kwargs["prefetch_factor"] = self.prefetch_factor
        return (ResumableDataLoader if train else DataLoader)(ds, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
