"""A tiny Llama that exists offline: random init, then a short pretraining on stdlib docstrings.

No PyPI package ships small causal-LM weights, so the offline LoRA default makes its own base: a
2-layer ``LlamaForCausalLM`` over the offline tokenizer's vocabulary, trained for a few hundred
steps on the standard library's docstrings and saved with ``save_pretrained`` under the cache
folder, keyed by everything that decides its weights. Later runs load the folder.

``initializer_range`` is 0.3, not Llama's 0.02: LoRA leaves the output head frozen, and a head
drawn at 0.02 caps the logits so low that LoRA plateaus at loss 6.40 on memorisation (measured).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from laptrain.console import no_transformers_bars

CACHE_VERSION = 1
PRETRAIN_MODULES = (
    "argparse", "ast", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "difflib", "enum", "fnmatch", "fractions", "functools", "glob",
    "gzip", "heapq", "inspect", "json", "logging", "operator", "pathlib", "pickle", "pprint",
    "queue", "random", "re", "shlex", "shutil", "statistics", "string", "subprocess", "tempfile",
    "textwrap", "threading", "timeit", "typing", "uuid", "warnings", "zipfile",
)  # fmt: skip


def tiny_llama_config(
    tokenizer: Any,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 192,
    max_position_embeddings: int = 1024,
    initializer_range: float = 0.3,
) -> Any:
    """A ``LlamaConfig`` over ``tokenizer``'s vocabulary (ids, BOS/EOS/pad taken from it)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _corpus(modules: tuple[str, ...]) -> list[str]:
    from laptrain.families.classifier.stdlib_docstrings import collect_examples

    return [row["text"] for row in collect_examples({"all": list(modules)})]


def _blocks(tokenizer: Any, texts: list[str], seq_len: int) -> torch.Tensor:
    """Docstrings as BOS + text + EOS, concatenated and cut into ``seq_len`` rows."""
    ids: list[int] = []
    for text in texts:
        ids += [tokenizer.bos_token_id, *tokenizer.encode(text, add_special_tokens=False)]
        ids.append(tokenizer.eos_token_id)
    rows = len(ids) // seq_len
    if rows == 0:
        raise ValueError("the pretraining corpus is shorter than one sequence")
    return torch.tensor(ids[: rows * seq_len]).view(rows, seq_len)


def pretrain(
    model: torch.nn.Module,
    blocks: torch.Tensor,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
) -> list[float]:
    """AdamW with a linear warm-up (10%) and decay; returns the loss of every step."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup))),
    )
    model.train()
    losses = []
    for _ in range(steps):
        rows = torch.randint(0, blocks.shape[0], (batch_size,), generator=generator)
        batch = blocks[rows]
        loss = model(input_ids=batch, labels=batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def tiny_llama_key(tokenizer: Any, spec: dict[str, Any], texts: list[str]) -> str:
    """Content key: tokenizer, architecture, training settings and the corpus itself."""
    digest = hashlib.sha256()
    digest.update(json.dumps({"version": CACHE_VERSION, **spec}, sort_keys=True).encode())
    digest.update(tokenizer.backend_tokenizer.to_str().encode())
    digest.update(str(tokenizer.chat_template).encode())
    for text in texts:
        digest.update(text.encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def tiny_llama(
    tokenizer: Any,
    cache_dir: str | Path,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 192,
    initializer_range: float = 0.3,
    steps: int = 300,
    seq_len: int = 128,
    batch_size: int = 8,
    lr: float = 1e-2,
    seed: int = 0,
    modules: tuple[str, ...] | list[str] = PRETRAIN_MODULES,
) -> Path:
    """The offline base model's ``save_pretrained`` folder (with the tokenizer): built once.

    Deterministic for a given key (fixed seed, one data order). The defaults train in about 25 s
    on one free CPU thread (loss 10.5 -> about 5.9; measured): more threads than free cores make it
    several times slower.
    """
    modules = tuple(modules)
    arch = {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "initializer_range": initializer_range,
    }
    spec = {**arch, "steps": steps, "seq_len": seq_len, "batch_size": batch_size, "lr": lr}
    spec.update(seed=seed, modules=list(modules))
    texts = _corpus(modules)
    if not texts:
        raise FileNotFoundError(
            "no docstrings found in this Python's standard library (installed without its "
            "sources): set model.pretrained=<a causal LM folder or hub name>"
        )
    folder = Path(cache_dir) / "tiny_llama" / tiny_llama_key(tokenizer, spec, texts)
    if not (folder / "config.json").is_file():
        _build(tokenizer, folder, arch, spec, texts)
    return folder


def _build(
    tokenizer: Any, folder: Path, arch: dict[str, Any], spec: dict[str, Any], texts: list[str]
) -> None:
    """Pretrain the base ``spec`` describes and save it (with the tokenizer) as ``folder``."""
    from transformers import LlamaForCausalLM

    seq_len, seed = spec["seq_len"], spec["seed"]
    config = tiny_llama_config(tokenizer, **arch, max_position_embeddings=max(1024, seq_len))
    start = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
        blocks = _blocks(tokenizer, texts, seq_len)
        losses = pretrain(model, blocks, spec["steps"], spec["batch_size"], spec["lr"], seed)
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    with no_transformers_bars():  # a one-shard "Writing model shards" bar says nothing
        model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    record = {
        **spec,
        "first_loss": losses[0],
        "last_loss": sum(losses[-10:]) / len(losses[-10:]),
        "seconds": round(time.perf_counter() - start, 1),
    }
    (tmp / "pretraining.json").write_text(json.dumps(record, indent=1))
    try:
        tmp.rename(folder)
    except OSError:  # another process (a rank torchrun started beside this one) finished first
        if not (folder / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def masked_token_batches(
    count: int, batch: int = 2, seq: int = 32, vocab: int = 256, seed: int = 0
) -> list[dict[str, Any]]:
    """Random token rows whose first half is prompt (label -100): the masked instruction format,
    for the doctor's LoRA steps and the LoRA throughput benchmark."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(count):
        ids = torch.randint(4, vocab, (batch, seq), generator=generator)
        labels = ids.clone()
        labels[:, : seq // 2] = -100
        rows.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels})
    return rows
