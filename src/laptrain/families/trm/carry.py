"""The training carry: B slots, each a puzzle at some depth of deep supervision (docs/trm.md)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Carry:
    """State kept between optimizer steps; one row per slot.

    ``halted`` slots are refilled with a fresh puzzle at the start of the next step; a new run
    starts with every slot halted. ``min_steps`` is the exploration minimum drawn at refill (0 =
    none).
    """

    y: torch.Tensor
    z: torch.Tensor
    steps: torch.Tensor
    min_steps: torch.Tensor
    halted: torch.Tensor
    inputs: torch.Tensor
    labels: torch.Tensor

    @classmethod
    def empty(
        cls,
        batch: int,
        total_len: int,
        hidden: int,
        seq_len: int,
        device: torch.device,
        dtype: torch.dtype = torch.float32,
    ) -> Carry:
        """Every slot halted; y, z in ``dtype`` (the network's state dtype, not the default dtype
        that a precision plugin may have changed inside the step)."""
        return cls(
            y=torch.zeros(batch, total_len, hidden, device=device, dtype=dtype),
            z=torch.zeros(batch, total_len, hidden, device=device, dtype=dtype),
            steps=torch.zeros(batch, dtype=torch.long, device=device),
            min_steps=torch.zeros(batch, dtype=torch.long, device=device),
            halted=torch.ones(batch, dtype=torch.bool, device=device),
            inputs=torch.zeros(batch, seq_len, dtype=torch.long, device=device),
            labels=torch.zeros(batch, seq_len, dtype=torch.long, device=device),
        )

    @property
    def size(self) -> int:
        return self.steps.shape[0]

    def to(self, device: torch.device, dtype: torch.dtype | None = None) -> Carry:
        """On ``device``; with ``dtype``, the floating fields (y, z) cast to it too."""

        def move(t: torch.Tensor) -> torch.Tensor:
            return t.to(device, dtype if dtype is not None and t.is_floating_point() else t.dtype)

        return Carry(**{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain CPU tensors, loadable with ``weights_only=True``."""
        return {f.name: getattr(self, f.name).detach().cpu().clone() for f in fields(self)}

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> Carry:
        return cls(**{f.name: state[f.name] for f in fields(cls)})
