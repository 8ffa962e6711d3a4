"""The Tiny Recursive Model network (Jolicoeur-Martineau, arXiv:2510.04871), written from the paper.

One small network ``net`` of post-norm blocks refines two states: the answer ``y`` and the latent
``z``. Whether it updates z or y is signalled only by whether the input x is in the sum (paper
§4.3). One supervision step is ``cycles - 1`` latent recursions without gradients and one with
gradients; each latent recursion is ``latent_steps`` times ``z <- net(z, x + y)`` then once
``y <- net(y, z)`` (paper Fig. 3; ``net(h, inj)`` adds the injection before the blocks). The answer
head reads y; the halting head reads y at position 0 (docs/trm.md §1).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

MIXERS = ("mlp", "attention")
POSITIONS = ("none", "rope", "learned")


@dataclass(frozen=True)
class TRMArch:
    """Shape of the network and of one supervision step.

    ``cycles`` is the paper's T, ``latent_steps`` its n; ``swiglu_multiple`` rounds SwiGLU widths up
    (256 in the official code, docs/trm.md §1; 1 = no rounding).
    """

    vocab_size: int
    seq_len: int
    hidden_size: int = 128
    num_heads: int = 8
    layers: int = 2
    expansion: float = 2.0
    swiglu_multiple: int = 1
    mixer: str = "mlp"
    positions: str = "none"
    prefix_len: int = 1
    cycles: int = 2
    latent_steps: int = 2
    rms_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.mixer not in MIXERS:
            raise ValueError(f"model mixer={self.mixer!r}: choose one of {MIXERS}")
        if self.positions not in POSITIONS:
            raise ValueError(f"model positions={self.positions!r}: choose one of {POSITIONS}")
        if self.mixer == "mlp" and self.positions == "rope":
            raise ValueError("model positions=rope needs mixer=attention; use positions=none")
        if self.mixer == "attention" and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model hidden_size={self.hidden_size} must divide by num_heads={self.num_heads}"
            )
        if self.cycles < 1 or self.latent_steps < 1 or self.layers < 1:
            raise ValueError("model cycles, latent_steps and layers must be >= 1")
        if self.prefix_len < 0:
            raise ValueError("model prefix_len must be >= 0")

    @property
    def total_len(self) -> int:
        return self.prefix_len + self.seq_len


def swiglu_width(dim: int, expansion: float, multiple: int) -> int:
    """Inner width of a SwiGLU: round(expansion * dim * 2/3), rounded up to ``multiple``."""
    width = round(expansion * dim * 2 / 3)
    return -(-width // multiple) * multiple


def rms_norm(x: torch.Tensor, eps: float, dim: int = -1) -> torch.Tensor:
    """RMSNorm over ``dim`` without a learnable scale, computed in float32 (docs/trm.md §1)."""
    dtype = x.dtype
    x = x.float()
    return (x * torch.rsqrt(x.square().mean(dim, keepdim=True) + eps)).to(dtype)


def lecun_linear(fan_in: int, fan_out: int) -> nn.Linear:
    """Bias-free linear with truncated LeCun-normal init (std 1/sqrt(fan_in), cut at 2 std)."""
    layer = nn.Linear(fan_in, fan_out, bias=False)
    std = 1.0 / math.sqrt(fan_in)
    nn.init.trunc_normal_(layer.weight, std=std, a=-2 * std, b=2 * std)
    return layer


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` over the last axis; gate and up share one matmul."""

    def __init__(self, dim: int, expansion: float, multiple: int) -> None:
        super().__init__()
        width = swiglu_width(dim, expansion, multiple)
        self.gate_up = lecun_linear(dim, 2 * width)
        self.down = lecun_linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(F.silu(gate) * up)


def rope_tables(length: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, ...]:
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), inv_freq)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class SelfAttention(nn.Module):
    """Non-causal multi-head attention, optionally with rotary positions."""

    def __init__(self, arch: TRMArch) -> None:
        super().__init__()
        self.heads = arch.num_heads
        self.head_dim = arch.hidden_size // arch.num_heads
        self.qkv = lecun_linear(arch.hidden_size, 3 * arch.hidden_size)
        self.out = lecun_linear(arch.hidden_size, arch.hidden_size)
        self.use_rope = arch.positions == "rope"
        if self.use_rope:
            cos, sin = rope_tables(arch.total_len, self.head_dim)
            self.register_buffer("rope_cos", cos, persistent=False)
            self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, dim = x.shape
        qkv = self.qkv(x).view(batch, length, 3, self.heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(dim=2))
        if self.use_rope:
            cos, sin = self.rope_cos.to(q.dtype), self.rope_sin.to(q.dtype)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=False)
        return self.out(out.transpose(1, 2).reshape(batch, length, dim))


class SequenceMLP(nn.Module):
    """SwiGLU along the sequence axis (MLP-Mixer style): the paper's Sudoku mixer, no positions.

    ``W @ x`` over [B, L, D] mixes positions without transposing x (half the time of
    transpose + linear on CPU, measured).
    """

    def __init__(self, arch: TRMArch) -> None:
        super().__init__()
        self.mlp = SwiGLU(arch.total_len, arch.expansion, arch.swiglu_multiple)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.matmul(self.mlp.gate_up.weight, x).chunk(2, dim=1)
        return torch.matmul(self.mlp.down.weight, F.silu(gate) * up)


class Block(nn.Module):
    """Post-norm block: ``h = rms(h + mixer(h))``, ``h = rms(h + swiglu(h))``.

    With the MLP mixer the first norm runs over the sequence axis (per channel), as the official
    code normalizes the transposed [B, D, L] tensor before transposing back; over channels it
    learned Sudoku far slower here (blank-cell accuracy ~12% vs the reference 57% at 150 steps).
    """

    def __init__(self, arch: TRMArch) -> None:
        super().__init__()
        self.mixer = SequenceMLP(arch) if arch.mixer == "mlp" else SelfAttention(arch)
        self.mixer_norm_dim = 1 if arch.mixer == "mlp" else -1
        self.mlp = SwiGLU(arch.hidden_size, arch.expansion, arch.swiglu_multiple)
        self.eps = arch.rms_eps

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = rms_norm(h + self.mixer(h), self.eps, self.mixer_norm_dim)
        return rms_norm(h + self.mlp(h), self.eps)


class ReasoningNet(nn.Module):
    """The one tiny network: add the injection, then run the blocks."""

    def __init__(self, arch: TRMArch) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(arch) for _ in range(arch.layers))

    def forward(self, h: torch.Tensor, injection: torch.Tensor) -> torch.Tensor:
        h = h + injection
        for block in self.blocks:
            h = block(h)
        return h


@dataclass
class StepOutput:
    """Result of one supervision step: new (detached) states and the heads' outputs."""

    y: torch.Tensor
    z: torch.Tensor
    logits: torch.Tensor
    halt_logit: torch.Tensor


class TinyRecursiveModel(nn.Module):
    """Embeddings, the recursion of one supervision step, and the answer and halting heads.

    Args:
        arch: the shape (see :class:`TRMArch`).
        grad_checkpoint: recompute the net calls of the recursion with gradients in backward
            (less memory, about one extra forward of compute).
    """

    def __init__(self, arch: TRMArch, grad_checkpoint: bool = False) -> None:
        super().__init__()
        self.arch = arch
        self.grad_checkpoint = grad_checkpoint
        dim = arch.hidden_size
        self.embed = nn.Embedding(arch.vocab_size, dim)
        std = 1.0 / math.sqrt(dim)
        nn.init.trunc_normal_(self.embed.weight, std=std, a=-2 * std, b=2 * std)
        self.embed_scale = math.sqrt(dim)
        # On Sudoku every puzzle has the same identifier, so the official per-puzzle embedding is
        # one shared learned vector at prefix position 0, the other prefix positions zero
        # (docs/trm.md §1).
        self.prefix = nn.Parameter(torch.zeros(dim)) if arch.prefix_len > 0 else None
        self.pos_embed = None
        if arch.positions == "learned":
            self.pos_embed = nn.Parameter(torch.empty(arch.total_len, dim))
            nn.init.trunc_normal_(self.pos_embed, std=std, a=-2 * std, b=2 * std)
        # Fixed random starting states, not trained (docs/trm.md §1: buffers, truncated normal
        # std 1).
        self.register_buffer("y_init", nn.init.trunc_normal_(torch.empty(dim), a=-2.0, b=2.0))
        self.register_buffer("z_init", nn.init.trunc_normal_(torch.empty(dim), a=-2.0, b=2.0))
        self.net = ReasoningNet(arch)
        self.answer_head = lecun_linear(dim, arch.vocab_size)
        # Starts at "don't halt": zero weight, bias -5 (docs/trm.md §1).
        self.halt_head = nn.Linear(dim, 1)
        nn.init.zeros_(self.halt_head.weight)
        nn.init.constant_(self.halt_head.bias, -5.0)
        self._net_override: Callable[..., torch.Tensor] | None = None

    def set_net_call(self, call: Callable[..., torch.Tensor]) -> None:
        """Route the recursion through ``call`` (e.g. a compiled ``self.net``); not an nn.Module,
        so the net's weights are not registered twice."""
        if isinstance(call, nn.Module):
            raise TypeError("set_net_call takes a plain callable wrapping the net, not a Module")
        self._net_override = call

    def _net_call(self, h: torch.Tensor, injection: torch.Tensor) -> torch.Tensor:
        if self._net_override is not None:
            return self._net_override(h, injection)
        return self.net(h, injection)

    def embed_inputs(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token ids [B, L] -> input embedding x [B, prefix + L, D]."""
        x = self.embed(tokens)
        if self.arch.prefix_len:
            prefix = x.new_zeros(x.shape[0], self.arch.prefix_len, x.shape[-1])
            prefix[:, 0] = self.prefix.to(x.dtype)
            x = torch.cat([prefix, x], dim=1)
        if self.pos_embed is not None:
            x = (x + self.pos_embed.to(x.dtype)) / math.sqrt(2.0)
        return self.embed_scale * x

    def initial_states(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh (y, z) for ``batch`` puzzles: the fixed start vectors at every position."""
        shape = (batch, self.arch.total_len, self.arch.hidden_size)
        return self.y_init.expand(shape).clone(), self.z_init.expand(shape).clone()

    def _latent_recursion(
        self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor, with_grad: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        def call(h: torch.Tensor, injection: torch.Tensor) -> torch.Tensor:
            if with_grad and self.grad_checkpoint:
                return checkpoint(self._net_call, h, injection, use_reentrant=False)
            return self._net_call(h, injection)

        for _ in range(self.arch.latent_steps):
            z = call(z, x + y)
        y = call(y, z)
        return y, z

    def supervision_step(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> StepOutput:
        """One deep recursion: T-1 latent recursions without gradients, one with; then the heads.

        Gradients flow only through the last latent recursion (n + 1 net calls) and the heads;
        the returned states are detached so the next supervision step starts a new graph.
        """
        with torch.no_grad():
            for _ in range(self.arch.cycles - 1):
                y, z = self._latent_recursion(x, y, z, with_grad=False)
        y, z = self._latent_recursion(x, y, z, with_grad=torch.is_grad_enabled())
        logits = self.answer_head(y[:, self.arch.prefix_len :])
        halt_logit = self.halt_head(y[:, 0]).squeeze(-1).float()
        return StepOutput(y=y.detach(), z=z.detach(), logits=logits, halt_logit=halt_logit)
