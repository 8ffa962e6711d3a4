"""Gradient checkpointing replays the forward's dropout masks where torch does not restore the
device generator (MPS, pytorch#127676; issue 24, item 8).

No MPS here: the CPU generator stands in for the MPS one. ``preserve_rng_state=False`` makes torch
leave it alone on recompute, as torch does with the MPS generator, and a stand-in device module
whose ``get_rng_state`` / ``set_rng_state`` read and set the CPU generator (recording the calls)
takes ``torch.mps``'s place in ``UNSTASHED_DEVICE_RNG``.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from laptrain.families.classifier.text_classifier import TextClassifierModule
from laptrain.families.lora.causal_lm import CausalLMLoRAModule
from laptrain.model import gradient_checkpointing as checkpointing
from laptrain.model.gradient_checkpointing import ReplayDeviceRng, device_rng_contexts
from tests.conftest import TINY_BERT

CPU_RNG = device_rng_contexts(torch.get_rng_state, torch.set_rng_state)
LLAMA = {
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
}


def block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.dropout(torch.tanh(x @ w), p=0.5, training=True)
    return torch.nn.functional.dropout(h @ w, p=0.5, training=True)


def grad_and_rng_after(checkpointed: bool, backwards: int = 1, **kwargs):
    """w's gradient and the CPU generator's state after backward, from the same seed."""
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8)
    if checkpointed:
        y = checkpoint(block, x, w, use_reentrant=False, preserve_rng_state=False, **kwargs)
    else:
        y = block(x, w)
    for i in range(backwards):
        y.square().sum().backward(retain_graph=i < backwards - 1)
    return w.grad, torch.get_rng_state()


def test_without_the_generator_restored_the_recompute_draws_other_masks():
    # the stand-in for MPS today: the gradient is that of another mask than the loss
    plain_grad, plain_rng = grad_and_rng_after(False)
    grad, rng = grad_and_rng_after(True)
    assert not torch.equal(grad, plain_grad)
    assert not torch.equal(rng, plain_rng)


def test_device_rng_contexts_give_the_unchecked_gradient_and_leave_the_stream_alone():
    plain_grad, plain_rng = grad_and_rng_after(False)
    grad, rng = grad_and_rng_after(True, context_fn=CPU_RNG)
    assert torch.equal(grad, plain_grad)
    assert torch.equal(rng, plain_rng)  # the rest of the step draws what it would have


def test_a_second_backward_recomputes_with_the_same_masks():
    plain_grad, plain_rng = grad_and_rng_after(False, backwards=2)
    grad, rng = grad_and_rng_after(True, backwards=2, context_fn=CPU_RNG)
    assert torch.equal(grad, plain_grad)
    assert torch.equal(rng, plain_rng)


def test_a_failing_recompute_still_puts_the_generator_back():
    record, replay = CPU_RNG()
    with record:
        pass
    torch.manual_seed(5)
    before = torch.get_rng_state()
    with pytest.raises(ZeroDivisionError), replay:
        torch.rand(3)
        raise ZeroDivisionError
    assert torch.equal(torch.get_rng_state(), before)


# ----- the wiring: both families, contexts only on MPS ------------------------------------------
class StandInDevice:
    """``torch.mps`` as far as the wiring uses it, on the CPU generator, counting its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def get_rng_state(self) -> torch.Tensor:
        self.calls.append("get")
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.calls.append("set")
        torch.set_rng_state(state)


def wrappers(model: torch.nn.Module) -> list[ReplayDeviceRng]:
    found = [m.__dict__.get("_gradient_checkpointing_func") for m in model.modules()]
    return [f for f in found if f is not None]


def torch_checkpoint_calls(model: torch.nn.Module) -> list[tuple[object, str]]:
    """Where each layer's ``functools.partial`` of torch's checkpoint sits: inside our wrapper,
    or (before the fix) directly on the layer."""
    places = []
    for module in model.modules():
        func = module.__dict__.get("_gradient_checkpointing_func")
        if isinstance(func, ReplayDeviceRng):
            places.append((func, "inner"))
        elif func is not None:
            places.append((module, "_gradient_checkpointing_func"))
    return places


def as_on(device_type: str, model: torch.nn.Module, monkeypatch) -> tuple[StandInDevice, list]:
    """Checkpointed calls seen as on ``device_type``, the stand-in as the MPS module, torch not
    restoring the CPU generator (as it does not restore MPS's); returns the keywords each call
    gave torch's checkpoint."""
    device = StandInDevice()
    monkeypatch.setitem(checkpointing.UNSTASHED_DEVICE_RNG, "mps", device)
    monkeypatch.setattr(checkpointing, "checkpointed_device_type", lambda *a: device_type)
    passed: list[dict] = []
    places = torch_checkpoint_calls(model)
    assert places
    for holder, name in places:
        inner = getattr(holder, name)

        def spy(function, *args, inner=inner, **kwargs):
            passed.append({**inner.keywords, **kwargs})
            return inner(function, *args, preserve_rng_state=False, **kwargs)

        monkeypatch.setattr(holder, name, spy)
    return device, passed


def classifier(checkpointing_on: bool) -> TextClassifierModule:
    torch.manual_seed(0)
    m = TextClassifierModule(
        num_labels=2, backbone=TINY_BERT, vocab_size=50, gradient_checkpointing=checkpointing_on
    )
    return m.train()


def classifier_grads(m: TextClassifierModule) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(1, 50, (2, 6))
    m.model(
        input_ids=ids, attention_mask=torch.ones_like(ids), labels=torch.tensor([0, 1])
    ).loss.backward()
    return {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


def lora(checkpointing_on: bool) -> CausalLMLoRAModule:
    torch.manual_seed(0)
    m = CausalLMLoRAModule(
        backbone=LLAMA, lora={"r": 4, "dropout": 0.5}, gradient_checkpointing=checkpointing_on
    )
    return m.train()


def lora_grads(m: CausalLMLoRAModule) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(1, 64, (2, 6))
    m.model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad for n, p in m.named_parameters() if p.grad is not None}


FAMILIES = {"classifier": (classifier, classifier_grads), "lora": (lora, lora_grads)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_on_mps_the_families_get_the_unchecked_gradients(family, monkeypatch):
    build, grads = FAMILIES[family]
    plain = grads(build(False))
    model = build(True)
    device, passed = as_on("mps", model, monkeypatch)
    after = grads(model)
    assert after.keys() == plain.keys()
    for name in plain:
        assert torch.equal(after[name], plain[name]), name
    assert passed and all(p["use_reentrant"] is False and "context_fn" in p for p in passed)
    # per checkpointed layer: get in the forward; get, set, set around the recompute
    assert device.calls[:1] == ["get"] and device.calls.count("get") == 2 * len(passed)
    assert device.calls.count("set") == 2 * len(passed)


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_off_mps_the_checkpoint_calls_are_transformers_own(family, device_type, monkeypatch):
    build, grads = FAMILIES[family]
    plain = grads(build(False))
    model = build(True)
    defaults = [dict(getattr(h, n).keywords) for h, n in torch_checkpoint_calls(model)]
    device, passed = as_on(device_type, model, monkeypatch)
    after = grads(model)
    assert passed and all(p == defaults[0] for p in passed)  # no context_fn, same use_reentrant
    assert device.calls == []
    # with torch not restoring the generator, that is what MPS got before the fix
    assert any(not torch.equal(after[name], plain[name]) for name in plain)


def test_wrapping_twice_keeps_one_wrapper():
    m = classifier(True)
    before = wrappers(m.model)
    checkpointing.replay_device_rng(m.model)
    assert [w.inner for w in wrappers(m.model)] == [w.inner for w in before]
    assert all(not isinstance(w.inner, ReplayDeviceRng) for w in wrappers(m.model))


def test_the_device_type_is_the_checkpointed_tensors_one():
    meta = torch.empty(2, device="meta")
    cpu = torch.zeros(2)
    seen = checkpointing.checkpointed_device_type
    assert seen(print, (cpu,), {}) == "cpu"
    assert seen(print, (cpu, meta), {}) == "meta"
    assert seen(functools.partial(print, hidden=[meta]), (), {}) == "meta"
    assert checkpointing.unstashed_rng_module("cuda") is None
    assert checkpointing.unstashed_rng_module("cpu") is None
    assert checkpointing.unstashed_rng_module("mps") is torch.mps
