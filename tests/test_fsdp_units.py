"""FSDP units (issue 24, item 3): each family's wrap policy, one dtype per unit, and the
preflight's FSDP arithmetic (1/N of the state plus the units gathered at the peak).

Lightning refuses FSDP on CPU, so the policy is checked on the module tree (which modules become
units, which parameters each flattens), and once through torch's own FSDP on CPU: one gloo rank,
``device_id=cpu`` (torch's check for an accelerator is skipped when a device is given,
``torch/distributed/fsdp/_init_utils.py: _init_device_handle``), wrapping the module as
Lightning's ``FSDPStrategy._setup_model`` does with the strategy's ``kwargs``.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy
from torch import nn

from laptrain.families.lora import FAMILY as LORA
from laptrain.family import family_of_module, installed_families
from laptrain.model.fsdp_units import (
    UnitRule,
    fsdp_strategy_for,
    gathered_units,
    unit_params,
    unit_rule,
    units_with_mixed_dtypes,
    unwrapped_name,
    whole_state_dict,
)
from laptrain.preflight.activations import ActivationProfile, Quadratic
from laptrain.preflight.estimate import ModelMemory, model_memory


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def lora_bf16() -> nn.Module:
    """The LoRA smoke model (2-layer Llama, hidden 32) with its base in bfloat16."""
    from laptrain.families.lora.causal_lm import CausalLMLoRAModule
    from laptrain.families.lora.smoke import BACKBONE

    torch.manual_seed(0)
    return CausalLMLoRAModule(backbone=dict(BACKBONE), lora={"r": 4}, base_dtype="bfloat16")


@pytest.fixture(scope="module")
def lora() -> nn.Module:
    return lora_bf16()


def adapter_leaves(module: nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if ".lora_A." in n or ".lora_B." in n]


# ----- the module tree ------------------------------------------------------------------------
def test_one_root_unit_mixes_the_bf16_base_with_the_fp32_adapters(lora):
    assert {(p.dtype, p.requires_grad) for p in lora.parameters()} == {
        (torch.bfloat16, False),
        (torch.float32, True),
    }
    assert units_with_mixed_dtypes(lora, None) == ["<root> (bfloat16, float32)"]


def test_decoder_layers_alone_still_mix_dtypes_inside_each_layer(lora):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    mixed = units_with_mixed_dtypes(lora, {LlamaDecoderLayer})
    assert mixed == [
        f"model.base_model.model.model.layers.{i} (bfloat16, float32)" for i in range(2)
    ]


def test_the_lora_policy_wraps_decoder_layers_and_adapters_with_one_dtype_each(lora):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    rule = unit_rule(lora)
    assert family_of_module(lora) is LORA
    assert rule.layers == (LlamaDecoderLayer,)  # the base's _no_split_modules
    assert units_with_mixed_dtypes(lora, rule) == []
    units = unit_params(lora, rule)
    layers = [f"model.base_model.model.model.layers.{i}" for i in range(2)]
    leaves = adapter_leaves(lora)
    assert len(leaves) == 2 * 7 * 2  # lora_A and lora_B on 7 linears in each of 2 layers
    assert set(units) == {"", *layers, *leaves}
    for name, params in units.items():  # one dtype and one requires_grad per unit
        assert len({(p.dtype, p.requires_grad) for _, p in params}) == 1, name
    assert all(p.dtype == torch.float32 and p.requires_grad for n in leaves for _, p in units[n])
    root = {n for n, _ in units[""]}
    assert root == {
        "model.base_model.model.model.embed_tokens.weight",
        "model.base_model.model.model.norm.weight",
        "model.base_model.model.lm_head.weight",
    }


def test_classifier_policy_names_the_bert_layer_and_each_layer_becomes_a_unit():
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertLayer

    from laptrain.families.classifier.smoke import build

    module, _ = build(0, 1)
    rule = unit_rule(module)
    assert set(rule.layers) == {BertEmbeddings, BertLayer} and rule.leaves == {}
    layers = [n for n, m in module.named_modules() if isinstance(m, BertLayer)]
    assert len(layers) == module.model.config.num_hidden_layers
    units = unit_params(module, rule)
    assert set(layers) < set(units)
    assert units_with_mixed_dtypes(module, rule) == []


def test_trm_under_fsdp_is_refused_in_one_line_naming_ddp():
    """TRM back-propagates inside its training step; on 2 CPU ranks FSDP raised at step 1."""
    from laptrain.families.trm.smoke import build

    module, _ = build(0, 1)
    strategy = FSDPStrategy()
    with pytest.raises(ValueError, match="cannot train trm") as err:
        fsdp_strategy_for(module, strategy)
    assert "\n" not in str(err.value) and "use trainer=ddp" in str(err.value)
    assert "auto_wrap_policy" not in strategy.kwargs


def test_every_family_names_its_fsdp_layers_or_why_fsdp_cannot_train_it():
    assert all(bool(f.fsdp_layers) != bool(f.fsdp_refusal) for f in installed_families())


def test_an_integer_parameter_is_reported_as_not_floating_point():
    """A 4-bit base whose weights are stored as uint8 (bitsandbytes' default storage)."""
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    model[0].weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.uint8), requires_grad=False)
    assert units_with_mixed_dtypes(model, None) == ["<root> (uint8: not floating point)"]


# ----- the strategy ---------------------------------------------------------------------------
def test_fsdp_strategy_for_sets_the_policy_and_leaves_other_strategies_alone(lora):
    from torch.distributed.fsdp.wrap import CustomPolicy

    fsdp = FSDPStrategy(sharding_strategy="FULL_SHARD", state_dict_type="full")
    assert "auto_wrap_policy" not in fsdp.kwargs  # Lightning's default: the root alone
    assert fsdp_strategy_for(lora, fsdp) is fsdp
    policy = fsdp.kwargs["auto_wrap_policy"]
    assert isinstance(policy, CustomPolicy) and isinstance(policy._lambda_fn, UnitRule)
    ddp = DDPStrategy()
    before = dict(vars(ddp))
    assert fsdp_strategy_for(lora, ddp) is ddp and vars(ddp) == before
    own = FSDPStrategy(auto_wrap_policy={nn.Linear})  # a policy the config names stays
    kept = own.kwargs["auto_wrap_policy"]
    assert fsdp_strategy_for(lora, own).kwargs["auto_wrap_policy"] is kept
    assert fsdp_strategy_for(lora, "ddp") == "ddp"


def test_fsdp_strategy_for_refuses_units_fsdp_could_not_flatten():
    model = nn.Sequential(nn.Linear(4, 4, bias=False))
    model[0].weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.uint8), requires_grad=False)
    with pytest.raises(ValueError, match="one floating dtype") as err:
        fsdp_strategy_for(model, FSDPStrategy())
    assert "\n" not in str(err.value) and "uint8: not floating point" in str(err.value)


@pytest.fixture
def one_rank(tmp_path):
    """A one-rank gloo process group, taken down after the test (torchmetrics would sync)."""
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def wrap(module: nn.Module, strategy: FSDPStrategy, **extra: object) -> nn.Module:
    """What ``FSDPStrategy._setup_model`` does, on the CPU."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(
        module,
        sharding_strategy=strategy.sharding_strategy,
        device_id=torch.device("cpu"),
        **strategy.kwargs,
        **extra,
    )


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_torch_fsdp_refuses_the_root_unit_and_takes_the_family_policy(one_rank):
    from torch.distributed.fsdp import FullyShardedDataParallel

    with pytest.raises(ValueError, match="Must flatten tensors with uniform dtype"):
        wrap(lora_bf16(), FSDPStrategy())  # what trainer=fsdp did before
    module = lora_bf16()
    expected = set(unit_params(module, unit_rule(module)))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        wrapped = wrap(module, fsdp_strategy_for(module, FSDPStrategy()))
    # no unit mixes frozen and trainable parameters either (torch warns that its unsharded
    # gradient would be the whole unit's size, _validate_frozen_params in _wrap_utils.py)
    assert not [w for w in seen if "requires_grad=True and False" in str(w.message)]
    units = {
        n.replace("_fsdp_wrapped_module.", "").removesuffix("._fsdp_wrapped_module")
        for n, m in wrapped.named_modules()
        if isinstance(m, FullyShardedDataParallel)
    }
    assert units == expected
    flat = [m._flat_param for m in wrapped.modules() if isinstance(m, FullyShardedDataParallel)]
    assert len(flat) == len(expected)
    assert {p.dtype for p in flat} == {torch.bfloat16, torch.float32}  # one dtype each
    ids = torch.randint(3, 64, (2, 8))
    logits = wrapped(ids, torch.ones_like(ids))
    logits.float().logsumexp(-1).mean().backward()
    trainable = [p for p in wrapped.parameters() if p.requires_grad]
    assert trainable and all(p.grad is not None for p in trainable)


# ----- the preflight's FSDP arithmetic ----------------------------------------------------------
class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width, bias=False)


class Stack(nn.Module):
    """Layers of the given widths under a root that owns a small head."""

    _no_split_modules = ["Layer"]

    def __init__(self, widths: list[int]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer(w) for w in widths)
        self.head = nn.Linear(4, 1, bias=False)


def no_activations() -> ActivationProfile:
    zero = Quadratic(0.0, 0.0, 0.0)
    return ActivationProfile(0.0, zero, zero, zero, zero, zero, 0, False)


def memory_of(model: nn.Module) -> ModelMemory:
    params = sum(p.numel() for p in model.parameters())
    units = gathered_units(model)
    gathered = float((units.params + units.grads) * 4)
    return ModelMemory(params, params, 4, 0, no_activations(), 1.0, gathered)


def test_the_gathered_units_are_the_root_and_the_two_largest_layers():
    model = Stack([8, 6, 4, 2])  # 64 + 36 + 16 + 4 = 120 parameters in layers, 4 in the root
    units = gathered_units(model)
    assert units.params == 4 + 64 + 36
    assert units.grads == 4 + 64  # the root's and the largest layer's, before reduce-scatter


def test_the_fsdp_estimate_grows_with_the_largest_unit():
    even, uneven = Stack([6, 6, 6, 6]), Stack([12])  # 144 layer parameters each
    assert sum(p.numel() for p in even.parameters()) == sum(p.numel() for p in uneven.parameters())
    small, large = (memory_of(m).estimate(1, 8, "cuda", 0, shards=4) for m in (even, uneven))
    for part in ("weights", "grads", "optimizer"):  # 1/N of the same state
        assert getattr(small, part) == getattr(large, part)
    assert large.gathered - small.gathered == 4 * ((4 + 144) + (4 + 144) - (4 + 72) - (4 + 36))
    assert large.total > small.total
    assert memory_of(even).estimate(1, 8, "cuda", 0).gathered == 0.0  # no FSDP, nothing gathered


def test_one_root_unit_gathers_the_whole_model():
    plain = Stack([6, 6])
    del Stack._no_split_modules  # no layer class: the root is the only unit
    try:
        units = gathered_units(plain)
    finally:
        Stack._no_split_modules = ["Layer"]
    params = sum(p.numel() for p in plain.parameters())
    assert units.params == params and units.grads == params


def test_model_memory_counts_the_gathered_units_in_the_fsdp_precision():
    from laptrain.families.classifier.tiny_bert import tiny_bert_classifier

    torch.manual_seed(0)
    model = tiny_bert_classifier(vocab_size=100, num_hidden_layers=2, max_position_embeddings=64)
    units = gathered_units(model)
    whole = sum(p.numel() for p in model.parameters())
    assert units.params < whole  # BertEmbeddings and the BertLayers are units of their own
    memory = model_memory(model, 16, "32-true")
    assert memory.fsdp_gathered == 4 * (units.params + units.grads)
    est = memory.estimate(2, 16, "cuda", 0, shards=4)
    assert est.gathered == memory.fsdp_gathered
    assert est.weights == pytest.approx(whole * 4 / 4)
    assert "gathered by FSDP" in est.line()
    assert model_memory(model, 16, "bf16-mixed").fsdp_gathered == 2 * (units.params + units.grads)


# ----- checkpoints and exports of a sharded module ----------------------------------------------
@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_a_sharded_lora_module_checkpoints_and_exports_its_whole_adapter(one_rank, tmp_path):
    """What FSDP users got before: ``trainable_keys`` named the parameters through FSDP's
    wrappers, so every checkpoint kept none of the full state dict's keys (0 adapters saved), and
    ``save_pretrained`` of the sharded module wrote an empty adapter."""
    from safetensors.torch import load_file

    module = lora_bf16()
    expected = {k: v.clone() for k, v in module.model.state_dict().items() if "lora_" in k}
    strategy = fsdp_strategy_for(module, FSDPStrategy())
    strategy._model = wrap(module, strategy)  # what FSDPStrategy._setup_model leaves there
    whole = whole_state_dict(SimpleNamespace(strategy=strategy, world_size=1))
    checkpoint = {"state_dict": dict(whole)}
    module.on_save_checkpoint(checkpoint)
    assert set(checkpoint["state_dict"]) == {f"model.{k}" for k in expected}
    module.export(tmp_path / "adapter", state_dict=checkpoint["state_dict"])
    written = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert len(written) == len(expected) == 2 * 7 * 2  # A and B, 7 projections, 2 layers
    for key, value in written.items():
        assert torch.equal(value, expected[key.replace(".weight", ".default.weight")])


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
def test_a_sharded_lora_checkpoint_gathers_the_adapters_and_never_the_frozen_base(
    one_rank, monkeypatch
):
    """Lightning's FSDP checkpoint (``state_dict_type: full``) gathered the whole model to rank 0's
    host memory and LoRA kept only the adapters of it: for an 8B bf16 base, 16 GB at every
    checkpoint. Now only the units holding adapters are gathered, and the checkpoint and the
    export hold the same adapters as the module."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    module = lora_bf16()
    expected = {
        f"model.{k}": v.clone() for k, v in module.model.state_dict().items() if "lora_" in k
    }
    strategy = fsdp_strategy_for(module, FSDPStrategy(state_dict_type="full"))
    strategy._model = wrap(module, strategy)
    summoned: list[nn.Module] = []
    summon = FSDP.summon_full_params

    def spy(unit: nn.Module, **kwargs: object) -> object:
        summoned.append(unit)
        return summon(unit, **kwargs)

    def whole_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the whole model was gathered")

    monkeypatch.setattr(FSDP, "summon_full_params", staticmethod(spy))
    monkeypatch.setattr(FSDP, "state_dict_type", staticmethod(whole_model))
    for gathered in (
        strategy.lightning_module_state_dict(),  # what Trainer.save_checkpoint reads
        whole_state_dict(SimpleNamespace(strategy=strategy, world_size=1)),  # the export's
    ):
        assert gathered.keys() == expected.keys()
        assert all(torch.equal(gathered[k], v) for k, v in expected.items())
        assert {v.dtype for v in gathered.values()} == {torch.float32}
    adapters = sum(v.numel() for v in expected.values())
    assert summoned and sum(u._flat_param.numel() for u in summoned) == 2 * adapters
    assert all(u._flat_param.requires_grad for u in summoned)  # no frozen unit gathered


@pytest.mark.filterwarnings("ignore:FSDP is switching to use `NO_SHARD`")
@pytest.mark.parametrize(
    ("precision", "buffers"), [("bf16-mixed", torch.float32), ("bf16-true", torch.bfloat16)]
)
def test_rope_buffers_stay_float32_under_fsdp_mixed_precision(one_rank, precision, buffers):
    """Lightning's FSDP mixed precision cast every buffer to the 16-bit dtype at the first forward,
    so RoPE's inv_freq was rounded under trainer=fsdp only; the parameters still gather in bf16."""
    from lightning.pytorch.plugins.precision import FSDPPrecision

    from laptrain.families.lora.causal_lm import CausalLMLoRAModule
    from laptrain.families.lora.smoke import BACKBONE

    torch.manual_seed(0)
    module = CausalLMLoRAModule(backbone=dict(BACKBONE), lora={"r": 4}, base_dtype="float32")
    if precision.endswith("-true"):
        module = FSDPPrecision(precision).convert_module(module)  # what Lightning does first
    strategy = FSDPStrategy(precision_plugin=FSDPPrecision(precision))
    strategy = fsdp_strategy_for(module, strategy)
    config = strategy.mixed_precision_config
    assert (config.param_dtype, config.buffer_dtype) == (torch.bfloat16, buffers)
    wrapped = wrap(module, strategy, mixed_precision=config)
    ids = torch.randint(3, 64, (2, 8))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision.endswith("-mixed")):
        wrapped(ids, torch.ones_like(ids))  # FSDP casts the buffers at its lazy init
    rope = [b for n, b in wrapped.named_buffers() if n.endswith("inv_freq")]
    assert rope and {b.dtype for b in rope} == {buffers}


def test_a_classifier_exports_the_state_dict_it_is_given(tmp_path):
    from transformers import AutoModelForSequenceClassification

    from laptrain.families.classifier.text_classifier import TextClassifierModule

    small = dict(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    module = TextClassifierModule(num_labels=2, backbone={"model_type": "bert", **small})
    whole = {
        k: torch.full_like(v, 0.5) if v.is_floating_point() else v
        for k, v in module.state_dict().items()
    }
    module.export(tmp_path / "model", state_dict=whole)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "model")
    assert all(torch.all(p == 0.5) for p in loaded.parameters())


def test_only_fsdp_gathers_a_whole_state_dict():
    assert whole_state_dict(SimpleNamespace(strategy=DDPStrategy(), world_size=2)) is None
    name = "model.layers.0._fsdp_wrapped_module._checkpoint_wrapped_module.q.lora_A.weight"
    assert unwrapped_name(name) == "model.layers.0.q.lora_A.weight"


def test_a_step_under_any_wrapping_strategy_back_propagates_the_whole_batch():
    """One GPU under trainer=fsdp failed at step 1 (issue 36's H200 run): the chunked backward ran
    inside FSDP's forward because only world_size > 1 sent it to Lightning's backward. Every
    strategy that wraps the module, with one process too, now does (the slow runs in
    tests/test_fsdp_runs.py train one FSDP rank like no FSDP)."""
    from lightning.pytorch.strategies import SingleDeviceStrategy

    from laptrain.ranks.processes import wraps_the_module

    assert wraps_the_module(FSDPStrategy()) and wraps_the_module(DDPStrategy())
    assert not wraps_the_module(SingleDeviceStrategy(device=torch.device("cpu")))
