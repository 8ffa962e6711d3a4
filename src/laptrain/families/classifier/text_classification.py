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
import re
import secrets
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities import rank_zero_info
from torch.utils.data import DataLoader

from laptrain.data.collate import PadCollator, padded_length
from laptrain.data.sampler import LengthGroupedBatchSampler, ResumableDataLoader, replicas_of
from laptrain.data.tables import Table, check_fractions, resolve_files
from laptrain.data.workers import WorkerInit, worker_context
from laptrain.families.classifier.tokenizer import (
    load_tokenizer,
    tokenizer_fingerprint,
    train_wordpiece,
)
from laptrain.files import file_digest, fsync_dir, fsync_file, pid_alive

from .labelled_files import LabelledSplits, read_labelled
from .train_fraction import check_train_fraction, train_subset

CACHE_VERSION = 3  # 2: stratified split; 3: rows read and checked by laptrain.families.classifier.labelled_files


META = "meta.json"
# An entry up to this size has every file's sha256 checked each time a process first uses it
# (sha256 reads ~1.7 GB/s here: 0.15 s at most); a larger one is checked by file list and sizes.
VERIFY_DIGESTS_UP_TO = 256 << 20
STALE_ELSEWHERE_SECONDS = 24 * 3600  # another host's tmp folder in a shared cache
_TMP_NAME = re.compile(r"^[0-9a-f]+\.(?:tmp|old)(?P<pid>\d+)(?:-\w+)?(?:@(?P<host>.+))?$")


def _tmp_path(entry: Path, kind: str = "tmp") -> Path:
    """``<key>.tmp<pid>-<random>@<host>``: a folder of this process next to ``entry`` (``old``: a
    broken entry moved aside), named so that a later run can tell whether its writer is gone."""
    name = f"{entry.name}.{kind}{os.getpid()}-{secrets.token_hex(3)}@{socket.gethostname()}"
    return entry.with_name(name)


def remove_stale_tmp(parent: Path) -> None:
    """Remove the ``<key>.tmp<pid>`` folders whose writer is gone: this host's whose pid is not
    alive (a killed run), another host's (a shared cache) when a day old."""
    try:
        children = list(parent.iterdir())
    except OSError:
        return
    host = socket.gethostname()
    for child in children:
        found = _TMP_NAME.match(child.name)
        if not found:
            continue
        try:
            if found["host"] in (None, host):  # no host: written by laptrain before 2026-12
                stale = not pid_alive(int(found["pid"]))
            else:
                stale = time.time() - child.stat().st_mtime > STALE_ELSEWHERE_SECONDS
        except OSError:
            continue
        if stale:
            shutil.rmtree(child, ignore_errors=True)


def _seal(tmp: Path, meta: Mapping[str, Any]) -> None:
    """Write ``meta.json`` into the finished ``tmp`` with every file's size and sha256, after
    making each file and folder durable (fsync), so a crash never leaves a renamed entry whose
    files are missing or empty."""
    files: dict[str, list[Any]] = {}
    for path in sorted(tmp.rglob("*")):
        if path.is_dir():
            fsync_dir(path)
        elif path.is_file() and path != tmp / META:
            fsync_file(path)
            files[path.relative_to(tmp).as_posix()] = [path.stat().st_size, file_digest(path)]
    with (tmp / META).open("w", encoding="utf-8") as f:
        f.write(json.dumps({**meta, "files": files}, indent=1))
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp)


def entry_ready(entry: Path) -> bool:
    """Whether ``entry`` is a complete cache entry: its ``meta.json`` lists every file with its
    size and sha256, and they match (sha256 read only up to ``VERIFY_DIGESTS_UP_TO`` in all)."""
    try:
        files = json.loads((entry / META).read_text(encoding="utf-8"))["files"]
        sizes = {rel: int(size) for rel, (size, _) in files.items()}
        if any((entry / rel).stat().st_size != size for rel, size in sizes.items()):
            return False
        if sum(sizes.values()) <= VERIFY_DIGESTS_UP_TO:
            return all(file_digest(entry / rel) == d for rel, (_, d) in files.items())
        return True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def publish_entry(tmp: Path, entry: Path, meta: Mapping[str, Any]) -> None:
    """Seal the finished ``tmp`` folder (``meta`` plus checksums) and rename it into place. When
    another writer published ``entry`` meanwhile, theirs is kept and ``tmp`` removed; a broken
    ``entry`` (a crash, a checksum that no longer matches) is moved aside and replaced."""
    _seal(tmp, meta)
    for _ in range(4):
        try:
            os.rename(tmp, entry)
            break
        except OSError:
            if entry_ready(entry):  # another writer won the race: theirs is as good
                shutil.rmtree(tmp, ignore_errors=True)
                return
            aside = _tmp_path(entry, "old")
            try:
                os.rename(entry, aside)
            except FileNotFoundError:  # another writer moved it aside first: try again
                continue
            shutil.rmtree(aside, ignore_errors=True)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"could not publish the cache entry {entry}: remove it and run again")
    fsync_dir(entry.parent)


@contextmanager
def building(entry: Path) -> Iterator[Path]:
    """A fresh tmp folder for ``entry``, removed when the build fails (nothing half-written stays
    behind; a killed build's folder is removed by a later run, ``remove_stale_tmp``)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_path(entry)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already when it was published


def _check_batch_size(batch_size: int | None) -> None:
    if batch_size is not None and int(batch_size) < 1:
        raise ValueError(
            f"batch size must be >= 1 (got {batch_size}): set hardware.batch_size=<n> "
            "or pick another hardware profile"
        )


def _batch_sizes(
    batch_size: int | None, eval_batch_size: int | None
) -> tuple[int | None, int | None]:
    """(train, eval) batch sizes, checked; eval defaults to train. A train size of None is
    decided by the run plan, which passes it through ``with_batch_sizes``."""
    _check_batch_size(batch_size)
    if batch_size is None:
        return None, int(eval_batch_size) if eval_batch_size else None
    return int(batch_size), int(eval_batch_size or batch_size)


def _check_reading(
    max_length: int, val_fraction: float, test_fraction: float, train_fraction: float
) -> None:
    if max_length < 8:
        raise ValueError(f"data.max_length must be >= 8 (got {max_length})")
    check_fractions(val_fraction, test_fraction)
    check_train_fraction(train_fraction)


class TextClassificationDataModule(pl.LightningDataModule):
    """Texts with one label each, split into train / val / test.

    Rows are read and checked by ``laptrain.families.classifier.labelled_files`` (the same rules train.py applies
    before the run folder exists), so bad data is one line naming the file, the row and the fix.

    Args:
        files: split name -> file (``train``, ``validation``/``val``, ``test``, or ``all`` to
            split); a split set to null is split off train.
        hub_name, hub_config: a Hugging Face dataset name, used instead of ``files`` when online.
        builder: a callable returning ``files`` (e.g. the offline stdlib-docstrings corpus).
        text_column, label_column: column names in the files.
        group_column: split so that rows sharing this column's value stay in one split.
        label_names: fixed label order; default = sorted labels found in train.
        tokenizer: pretrained name or folder; ``None`` trains a WordPiece of ``vocab_size``.
        max_length: longest sequence kept (truncation); batches are padded only to their longest.
        val_fraction, test_fraction, split_seed: used when the files do not give those splits.
        folds, fold: k-fold cross-validation: test is held out as without folds, the rest divided
            into ``folds`` folds (stratified, whole groups, seeded) and fold ``fold`` validates
            (``val_fraction`` unused; no validation file).
        encoding: the text files' encoding (Parquet carries its own).
        incomplete_rows: ``error`` refuses rows whose text or label is empty or null, naming
            them; ``skip`` leaves them out and logs how many.
        train_fraction: train on this seeded, stratified share of the train split (tuning).
        group_by_length: batch similar lengths together (seeded, resumable); false = random batches.
    """

    shards_itself = True  # data.contracts.ShardsItself: LengthGroupedBatchSampler per rank

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
        tokenizer: str | Mapping[str, Any] | None = None,
        vocab_size: int = 8000,
        max_length: int = 256,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        split_seed: int = 42,
        folds: int | None = None,
        fold: int = 0,
        encoding: str = "utf-8",
        incomplete_rows: Literal["error", "skip"] = "error",
        train_fraction: float = 1.0,
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
        self.batch_size, self.eval_batch_size = _batch_sizes(batch_size, eval_batch_size)
        _check_reading(max_length, val_fraction, test_fraction, train_fraction)
        self.files = dict(files) if files else None
        self.hub_name, self.hub_config, self.builder = hub_name, hub_config, builder
        self.text_column, self.label_column = text_column, label_column
        self.group_column = group_column
        self.fixed_label_names = list(label_names) if label_names else None
        self.tokenizer_name, self.vocab_size, self.max_length = tokenizer, vocab_size, max_length
        self.val_fraction, self.test_fraction = val_fraction, test_fraction
        self.split_seed, self.encoding, self.incomplete_rows = split_seed, encoding, incomplete_rows
        self.folds, self.fold = folds, fold
        self.train_fraction = float(train_fraction)
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.persistent_workers, self.prefetch_factor = persistent_workers, prefetch_factor
        self.group_by_length, self.pad_to_multiple_of = group_by_length, pad_to_multiple_of
        self.seed, self.cache_dir = seed, Path(cache_dir)
        self.entry: Path | None = None
        self._ready: Path | None = None  # the entry this process built or verified
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
        return resolve_files(self.files or (self.builder() if self.builder else None))

    def _cache_key(self, files: dict[str, Path] | None) -> str:
        spec = {
            "version": CACHE_VERSION,
            "files": {k: file_digest(v) for k, v in (files or {}).items()},
            "hub": [self.hub_name, self.hub_config],
            "columns": [self.text_column, self.label_column, self.group_column],
            "labels": self.fixed_label_names,
            "split": [self.val_fraction, self.test_fraction, self.split_seed],
            "reading": [self.encoding, self.incomplete_rows],
            **({"train_fraction": self.train_fraction} if self.train_fraction < 1 else {}),
            **({"folds": [self.folds, self.fold]} if self.folds else {}),
            "tokenizer": (  # by content: a tokenizer retrained into the same folder is a new key
                tokenizer_fingerprint(self.tokenizer_name)
                if self.tokenizer_name
                else f"wordpiece-{self.vocab_size}"
            ),
            "max_length": self.max_length,
        }
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]

    def _hub_tables(self) -> dict[str, Table]:
        """The hub dataset's splits as tables, so they are checked by the same rules as files."""
        import datasets

        datasets.disable_progress_bars()
        try:
            raw = datasets.load_dataset(self.hub_name, self.hub_config)
        except Exception as err:
            raise ConnectionError(
                f"cannot load hub dataset {self.hub_name!r} ({err.__class__.__name__}): "
                "check data.hub_name and the network, or use data.files.train=<local file>"
            ) from None
        return {
            split: Table(
                f"{self.hub_name} ({split})",
                list(ds.column_names),
                [(f"{self.hub_name} {split} row {i + 1}", r) for i, r in enumerate(ds)],
            )
            for split, ds in raw.items()
        }

    def read_splits(self, files: dict[str, Path] | None) -> LabelledSplits:
        """Texts and label ids per split, checked (``laptrain.families.classifier.labelled_files``)."""
        return read_labelled(
            files,
            text_column=self.text_column,
            label_column=self.label_column,
            group_column=self.group_column,
            label_names=self.fixed_label_names,
            encoding=self.encoding,
            incomplete_rows=self.incomplete_rows,
            val_fraction=self.val_fraction,
            test_fraction=self.test_fraction,
            split_seed=self.split_seed,
            folds=self.folds,
            fold=self.fold,
            tables=self._hub_tables() if files is None else None,
        )

    def prepare_data(self) -> None:
        """Build the tokenized cache entry unless a complete one is there (``entry_ready``): built
        in a tmp folder, sealed with checksums, then renamed into place (``publish_entry``)."""
        if self.entry is not None and self._ready == self.entry:
            return  # done earlier in this process: Lightning calls prepare_data again in fit
        files = None if (self.hub_name and not self.files) else self._resolve_files()
        entry = self.cache_dir / "tokenized" / self._cache_key(files)
        self.entry = entry
        if self._entry_ready(entry):
            return
        import datasets

        datasets.disable_progress_bars()
        data = self.read_splits(files)
        if self.train_fraction < 1:  # validation and test stay whole
            keep = train_subset(data.labels["train"], self.train_fraction, self.split_seed)
            data.texts["train"] = [data.texts["train"][i] for i in keep]
            data.labels["train"] = [data.labels["train"][i] for i in keep]
        tokenizer = (
            load_tokenizer(self.tokenizer_name)
            if self.tokenizer_name
            else train_wordpiece(data.texts["train"], self.vocab_size)
        )

        def encode(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
            ids = tokenizer(batch["text"], truncation=True, max_length=self.max_length)["input_ids"]
            return {"input_ids": ids, "length": [len(x) for x in ids]}

        with building(entry) as tmp:
            for split, texts in data.texts.items():
                ds = datasets.Dataset.from_dict({"text": texts, "labels": data.labels[split]})
                encoded = ds.map(encode, batched=True, remove_columns=["text"])
                encoded.save_to_disk(str(tmp / split))
            tokenizer.save_pretrained(str(tmp / "tokenizer"))
            meta = {
                "label_names": data.label_names,
                "sizes": {k: len(v) for k, v in data.texts.items()},
                "notes": data.notes,
            }
            publish_entry(tmp, entry, meta)
        self._ready = entry

    def _entry_ready(self, entry: Path) -> bool:
        """Whether ``entry`` is complete (then remembered for this process); a folder there that
        is not (a crash before laptrain sealed entries, a file changed since) is rebuilt. The tmp
        folders killed runs left next to it are removed first."""
        remove_stale_tmp(entry.parent)
        if entry_ready(entry):
            self._ready = entry
            return True
        if entry.exists():
            rank_zero_info(f"cache entry {entry} is incomplete or changed: building it again")
        return False

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
        for note in meta.get("notes", []):  # e.g. rows skipped under data.incomplete_rows=skip
            rank_zero_info(note)
        self.splits = {
            s: datasets.load_from_disk(str(self.entry / s)) for s in ("train", "val", "test")
        }
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.entry / "tokenizer"))

    @property
    def num_labels(self) -> int:
        return len(self.label_names)

    def model_kwargs(self) -> dict[str, Any]:
        """What the model needs to know about the data (see ``laptrain.job.run``)."""
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

    def longest_example(self, split: str = "train") -> int:
        """Tokens in the longest example of ``split`` once padded to ``pad_to_multiple_of``: the
        widest batch a length-grouped epoch can hold (``laptrain.data.contracts.KnowsLengths``)."""
        self.setup()
        return padded_length(max(self.splits[split]["length"], default=0), self.pad_to_multiple_of)

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
        return self._grouped_loader(split, ds, ds["length"])

    def _need_batch_size(self) -> None:
        if self.batch_size is None:
            raise ValueError(
                "this datamodule has no batch size yet: build it through the run plan "
                "(with_batch_sizes), or set data.batch_size=<n>"
            )

    def _collate(self) -> Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]]:
        return PadCollator(int(self.tokenizer.pad_token_id), self.pad_to_multiple_of)

    def _grouped_loader(self, split: str, ds: Any, lengths: Sequence[int]) -> DataLoader:
        """``ds`` in batches of similar ``lengths`` (seeded; resumable for train), collated by
        :meth:`_collate`."""
        self._need_batch_size()
        train = split == "train"
        replicas, rank = replicas_of(self.trainer)  # several processes: this rank's share
        sampler = LengthGroupedBatchSampler(
            lengths,
            self.batch_size if train else (self.eval_batch_size or self.batch_size),
            seed=self.seed,
            shuffle=train,
            mega_batches=50 if self.group_by_length else 0,
            replicas=replicas,
            rank=rank,
        )
        workers = int(self.num_workers or 0)
        kwargs: dict[str, Any] = {
            "batch_sampler": sampler,
            "collate_fn": self._collate(),
            "num_workers": workers,
            "pin_memory": bool(self.pin_memory),
            # Each new iterator draws a base seed; from a private generator it leaves the global
            # RNG (dropout) alone, so a resumed run's masks match an uninterrupted run's.
            "generator": torch.Generator().manual_seed(self.seed),
        }
        if workers > 0:  # both are errors with workers == 0 (docs/hardware.md §5)
            kwargs["persistent_workers"] = bool(self.persistent_workers)
            kwargs["prefetch_factor"] = self.prefetch_factor
            kwargs["worker_init_fn"] = WorkerInit(rank)  # signals stay with the main process
            kwargs["multiprocessing_context"] = worker_context()  # spawn: blocked until then
        return (ResumableDataLoader if train else DataLoader)(ds, **kwargs)

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")
