"""How many bytes of activations a model keeps for backward, per sample, as a function of length.

Formulas per architecture miss what a kernel or loss saves, so short passes are measured under
``saved_tensors_hooks`` (docs/hardware.md §9) and ``fixed + batch * (c + a*s + b*s^2)`` fitted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

MakeBatch = Callable[[int, int], Any]
LossFn = Callable[[nn.Module, Any], torch.Tensor]


@dataclass(frozen=True)
class Quadratic:
    """c + a*s + b*s^2 (bytes per sample at sequence length s)."""

    c: float
    a: float
    b: float

    def __call__(self, seq_len: int) -> float:
        return max(0.0, self.c + self.a * seq_len + self.b * seq_len * seq_len)

    @staticmethod
    def through(points: list[tuple[int, float]]) -> Quadratic:
        (x0, y0), (x1, y1), (x2, y2) = points
        d0 = y0 / ((x0 - x1) * (x0 - x2))
        d1 = y1 / ((x1 - x0) * (x1 - x2))
        d2 = y2 / ((x2 - x0) * (x2 - x1))
        b = d0 + d1 + d2
        a = -(d0 * (x1 + x2) + d1 * (x0 + x2) + d2 * (x0 + x1))
        c = d0 * x1 * x2 + d1 * x0 * x2 + d2 * x0 * x1
        return Quadratic(c, a, b)


@dataclass(frozen=True)
class ActivationProfile:
    """Saved-for-backward bytes: ``fixed`` once per step, the rest per sample."""

    fixed: float
    total: Quadratic  # everything saved, no checkpointing
    outside: Quadratic  # saved outside the repeated blocks
    block_inputs: Quadratic  # the inputs of all blocks (what checkpointing keeps)
    largest_block: Quadratic  # the largest block's own saved bytes (recomputed in backward)
    largest_tensor: Quadratic  # the largest single saved storage (backward's transient grads)
    blocks: int
    checkpointing: bool  # whether the model had gradient checkpointing on

    def per_sample(self, seq_len: int, checkpointing: bool | None = None) -> float:
        on = self.checkpointing if checkpointing is None else checkpointing
        if not on or not self.blocks:
            return self.total(seq_len)
        return self.outside(seq_len) + self.block_inputs(seq_len) + self.largest_block(seq_len)

    def freed_in_forward(self, seq_len: int) -> float:
        """Per sample, what gradient checkpointing frees in forward: every block's saved bytes
        but the largest block's (the one recomputed at a time)."""
        return max(0.0, self.total(seq_len) - self.outside(seq_len) - self.largest_block(seq_len))


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The layers gradient checkpointing would wrap."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # older transformers
        GradientCheckpointingLayer = ()  # noqa: N806
    blocks = [
        m
        for m in model.modules()
        if GradientCheckpointingLayer and isinstance(m, GradientCheckpointingLayer)
    ]
    if blocks:
        return blocks
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def find_hf_model(model: nn.Module) -> nn.Module | None:
    """The transformers model inside a LightningModule (or the model itself)."""
    from transformers import PreTrainedModel

    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def hf_batch_maker(model: nn.Module) -> MakeBatch:
    """Random token batches for a transformers classifier or causal LM inside ``model``."""
    hf = find_hf_model(model)
    if hf is None:
        raise ValueError(
            "the memory preflight needs a transformers model inside the module, or a make_batch "
            "function; set hardware.batch_size=<n> and preflight.enabled=false to skip it"
        )
    vocab = int(hf.config.vocab_size)
    causal = type(hf).__name__.endswith("ForCausalLM")
    labels = int(getattr(hf.config, "num_labels", 2) or 2)

    def make(batch: int, seq_len: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(batch * 100_003 + seq_len)
        ids = torch.randint(0, vocab, (batch, seq_len), generator=generator)
        target = ids.clone() if causal else torch.randint(0, labels, (batch,), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": target}

    return make


def hf_loss(model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    hf = find_hf_model(model)
    device = next(hf.parameters()).device
    return hf(**{k: v.to(device) for k, v in batch.items()}).loss


@contextlib.contextmanager
def _checkpointing_off(blocks: list[nn.Module]) -> Iterator[bool]:
    flags = [bool(getattr(b, "gradient_checkpointing", False)) for b in blocks]
    for block in blocks:
        if hasattr(block, "gradient_checkpointing"):
            block.gradient_checkpointing = False
    try:
        yield any(flags)
    finally:
        for block, flag in zip(blocks, flags, strict=True):
            if hasattr(block, "gradient_checkpointing"):
                block.gradient_checkpointing = flag


class _SavedBytes:
    """Distinct storages saved for backward, attributed to the block that was running."""

    def __init__(self, exclude: set[int], blocks: list[nn.Module]) -> None:
        self.exclude = exclude
        self.seen: set[int] = set()
        self.keep: list[torch.Tensor] = []
        self.current: int | None = None
        self.by_block = [0.0] * len(blocks)
        self.inputs = 0.0
        self.outside = 0.0
        self.largest = 0.0
        self.handles = []
        for index, block in enumerate(blocks):
            self.handles.append(
                block.register_forward_pre_hook(self._enter(index), with_kwargs=True)
            )
            self.handles.append(block.register_forward_hook(self._leave))

    def _enter(self, index: int) -> Callable:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            self.current = index
            first = args[0] if args else next(iter(kwargs.values()), None)
            if isinstance(first, torch.Tensor):
                self.inputs += first.numel() * first.element_size()

        return hook

    def _leave(self, module: nn.Module, args: tuple, output: Any) -> None:
        self.current = None

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key and key not in self.exclude and key not in self.seen:
            self.seen.add(key)
            self.keep.append(tensor)
            size = float(storage.nbytes())
            self.largest = max(self.largest, size)
            if self.current is None:
                self.outside += size
            else:
                self.by_block[self.current] += size
        # Not the tensor itself: a saved output would then hold its own grad_fn, a cycle through
        # C++ that Python's collector cannot see, and every measured graph (SmolLM2: 0.42 GiB)
        # stayed alive into the training run, adding to its peak.
        return tensor.detach()

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "bf16-mixed":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "16-mixed":
        return torch.autocast(device.type, dtype=torch.float16)
    return contextlib.nullcontext()


def measure_once(
    model: nn.Module,
    batch: Any,
    loss_fn: LossFn,
    precision: str,
    blocks: list[nn.Module],
) -> _SavedBytes:
    """Saved-for-backward bytes of one forward (no backward is run; nothing is updated)."""
    exclude = {p.untyped_storage().data_ptr() for p in model.parameters()}
    exclude |= {b.untyped_storage().data_ptr() for b in model.buffers()}
    counter = _SavedBytes(exclude, blocks)
    device = next(model.parameters()).device
    try:
        hooks = torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t)
        with hooks, _autocast(device, precision):
            loss_fn(model, batch)
    finally:
        counter.close()
    counter.keep.clear()
    return counter


def measure_activations(
    model: nn.Module,
    seq_len: int,
    precision: str = "32-true",
    make_batch: MakeBatch | None = None,
    loss_fn: LossFn | None = None,
) -> ActivationProfile:
    """Measure at batch 1 and three short lengths (and batch 2 once), fit, extrapolate to any length
    ("true" half/double precisions: in fp32, scaled by the caller)."""
    make_batch = make_batch or hf_batch_maker(model)
    loss_fn = loss_fn or hf_loss
    base = min(max(8, seq_len // 4), 32)
    lengths = [base, 2 * base, 3 * base]
    blocks = repeated_blocks(model)
    was_training = model.training
    model.train()

    def parts(batch: int, length: int) -> list[float]:
        c = measure_once(model, make_batch(batch, length), loss_fn, precision, blocks)
        block = max(c.by_block, default=0.0)
        return [c.outside + sum(c.by_block), c.outside, c.inputs, block, c.largest]

    # Batch 1 at three lengths, batch 2 at one: 2 x one - two is what does not grow with the batch
    # (e.g. autocast's weight copies); the rest is per sample. fork_rng: dropout in these passes
    # must not shift the training run's random stream.
    try:
        with torch.random.fork_rng(devices=[]), _checkpointing_off(blocks) as checkpointing:
            ones = [parts(1, length) for length in lengths]
            two = parts(2, lengths[0])
    finally:
        model.train(was_training)
    fixed = [max(0.0, 2 * a - b) for a, b in zip(ones[0], two, strict=True)]
    fixed[4] = 0.0  # the largest tensor is a size, not a sum
    total, outside, inputs, block, largest = (
        Quadratic.through([(n, one[i] - fixed[i]) for n, one in zip(lengths, ones, strict=True)])
        for i in range(5)
    )
    return ActivationProfile(
        fixed=fixed[0],
        total=total,
        outside=outside,
        block_inputs=inputs,
        largest_block=block,
        largest_tensor=largest,
        blocks=len(blocks),
        checkpointing=checkpointing,
    )
