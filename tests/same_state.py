"""Exact equality of two checkpoints' parts, tensor by tensor (the "bit for bit" resume claim).

``repr`` of a state dict shows 4 decimals and only the edge elements of large tensors, so a
difference in Adam's moments deep inside a tensor passes it; this walks the nested dicts, lists
and tuples and compares every tensor with ``torch.equal`` (values, shape and dtype)."""

from __future__ import annotations

from typing import Any

import torch


def differences(a: Any, b: Any, where: str = "") -> list[str]:
    """Where ``a`` and ``b`` differ, as paths like ``optimizer_states[0].state.3.exp_avg``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and torch.equal(a, b)
        )
        return [] if same else [where or "<tensor>"]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where} keys {sorted(map(str, a.keys() ^ b.keys()))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{where}.{k}" if where else str(k))]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b) or type(a) is not type(b):
            return [f"{where} length {len(a)} != {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{where}[{i}]")]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def assert_same(a: Any, b: Any, what: str = "") -> None:
    """Every tensor ``torch.equal``, every other value ``==``; the message lists the first paths."""
    found = differences(a, b, what)
    assert not found, f"{len(found)} differ, e.g. {found[:5]}"
