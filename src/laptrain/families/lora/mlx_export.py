"""``laptrain export RUN --format mlx [--fuse] [--quant 4bit|8bit]``: a LoRA run for mlx-lm.

Without ``--fuse``: an mlx-lm adapter folder (``adapters.safetensors`` + ``adapter_config.json``)
that ``mlx_lm.load(base, adapter_path=DIR)`` applies to the run's base. peft stores ``lora_A`` as
(r, in) and ``lora_B`` as (out, r) under ``base_model.model.<module>.lora_A.weight`` and scales by
``lora_alpha / r`` (``/ sqrt(r)`` with rsLoRA); mlx-lm's ``LoRALinear`` computes
``scale * (x @ lora_a) @ lora_b`` with ``lora_a`` (in, r) and ``lora_b`` (r, out) under
``<module>.lora_a``, on the ``keys`` (module paths inside a block) of the last ``num_layers``
blocks (``mlx_lm.tuner.utils.linear_to_lora_layers``). Whatever that cannot express (DoRA, bias,
per-module ranks, a module outside the blocks or not a linear of mlx-lm's model) is refused.

With ``--fuse``: the adapter fused by mlx-lm itself, as ``mlx_lm fuse`` does (``load`` with the
adapter, each ``LoRALinear.fuse()``), optionally quantized by ``mlx_lm.utils.quantize_model``, and
saved by ``mlx_lm.utils.save`` with the run's tokenizer and chat template: ``mlx_lm.load(DIR)``
loads it. The weights keep the base's dtype. Both forms go through the export-folder rule
(:mod:`laptrain.commands.export_folder`). mlx is imported only here, when the command runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from laptrain.commands.export_folder import export_target
from laptrain.families.lora.adapter_folders import default_export_dir

MLX_QUANTS = {"4bit": 4, "8bit": 8}
INSTALL = 'pip install -e ".[mlx]"'
ADAPTER_WEIGHTS = "adapters.safetensors"
PEFT_WEIGHTS = "adapter_model.safetensors"
LORA_KEY = re.compile(r"base_model\.model\.(model\.layers\.(\d+)\.(.+))\.lora_([AB])\.weight")
REFUSED_OPTIONS = {  # peft adapter_config.json keys whose non-default value mlx-lm's LoRA lacks
    "use_dora": "DoRA (train with model.lora.use_dora=false)",
    "lora_bias": "a LoRA bias",
    "fan_in_fan_out": "fan_in_fan_out (Conv1D) layers",
    "modules_to_save": "fully trained modules (modules_to_save)",
    "rank_pattern": "per-module ranks (rank_pattern)",
    "alpha_pattern": "per-module alphas (alpha_pattern)",
    "trainable_token_indices": "trained token embeddings",
}


@dataclass(frozen=True)
class MlxExport:
    """What was written: the folder, and a line saying how to run it."""

    folder: Path
    what: str
    run_it: str


def import_mlx_lm() -> Any:
    """``mlx_lm``, or a one-line ValueError naming the extra to install."""
    try:
        import mlx.core  # noqa: F401
        import mlx_lm
    except ImportError as err:
        raise ValueError(
            f"--format mlx needs mlx and mlx-lm ({err.name or err} is not installed): {INSTALL}"
        ) from None
    return mlx_lm


def check_quant(quant: str | None, fuse: bool) -> None:
    if quant is None:
        return
    if quant not in MLX_QUANTS:
        raise ValueError(
            f"--quant {quant}: with --format mlx use {' or '.join(MLX_QUANTS)} (mlx-lm's "
            "quantizer), or drop --quant to keep the base's dtype"
        )
    if not fuse:
        raise ValueError(f"--quant {quant} quantizes a fused model: add --fuse, or drop --quant")


def mlx_lora_parameters(peft: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm's ``lora_parameters`` (rank, scale, dropout; ``keys`` added later) for a peft LoRA
    ``adapter_config.json``, or a one-line ValueError naming what mlx-lm cannot express."""
    kind = str(peft.get("peft_type", "LORA")).upper()
    if kind != "LORA":
        raise ValueError(f"the adapter is peft {kind}: --format mlx writes LoRA adapters")
    for key, what in REFUSED_OPTIONS.items():
        if peft.get(key):
            raise ValueError(f"the adapter uses {what}, which mlx-lm's LoRA cannot express")
    if peft.get("bias", "none") != "none":
        raise ValueError(
            f"the adapter trains biases (bias={peft['bias']}), which mlx-lm's LoRA lacks"
        )
    rank, alpha = int(peft["r"]), float(peft["lora_alpha"])
    scale = alpha / math.sqrt(rank) if peft.get("use_rslora") else alpha / rank
    return {"rank": rank, "scale": scale, "dropout": float(peft.get("lora_dropout") or 0.0)}


def mlx_tensors(
    peft_weights: dict[str, Any], rank: int
) -> tuple[dict[str, Any], list[int], list[str]]:
    """peft's ``lora_A``/``lora_B`` weights as mlx-lm's ``lora_a``/``lora_b`` (transposed), the
    block indices they cover, and the module paths inside a block (mlx-lm's ``keys``)."""
    out, layers, keys = {}, set(), set()
    for key, weight in peft_weights.items():
        match = LORA_KEY.fullmatch(key)
        if match is None:
            raise ValueError(
                f"the adapter holds {key}: mlx-lm's LoRA covers linear layers inside the "
                "transformer blocks (model.layers.N.*) only"
            )
        module, layer, key_in_block, side = match.groups()
        if weight.shape[0 if side == "A" else 1] != rank:
            raise ValueError(f"{key} has shape {tuple(weight.shape)}, not rank {rank}")
        out[f"{module}.lora_{side.lower()}"] = weight.T
        layers.add(int(layer))
        keys.add(key_in_block)
    if not out:
        raise ValueError("the adapter holds no LoRA weights")
    return out, sorted(layers), sorted(keys)


def check_modules(model: Any, tensors: dict[str, Any]) -> None:
    """Each adapted module is a linear layer of mlx-lm's model with the adapter's shape."""
    import mlx.nn as nn

    modules = dict(model.named_modules())
    for key, weight in tensors.items():
        path, leaf = key.rsplit(".", 1)
        module = modules.get(path)
        if not isinstance(module, nn.Linear):
            raise ValueError(f"mlx-lm's model has no linear layer {path}: it cannot load {key}")
        out_dims, in_dims = module.weight.shape
        want = (in_dims, weight.shape[1]) if leaf == "lora_a" else (weight.shape[0], out_dims)
        if tuple(weight.shape) != want:
            raise ValueError(f"{key} has shape {tuple(weight.shape)}, mlx-lm's {path} needs {want}")


def base_folder(name: str, revision: str | None) -> Path:
    """The base as a local folder mlx-lm loads: config.json with an architecture mlx-lm has, and
    ``model*.safetensors`` weights."""
    from laptrain.families.lora.tools import BASE_FIX

    folder = Path(name)
    if not folder.is_dir():
        from huggingface_hub import snapshot_download

        try:
            folder = Path(snapshot_download(name, revision=revision))
        except Exception as err:  # noqa: BLE001 - offline, unknown name: one line
            raise ValueError(
                f"the base {name} is not here ({type(err).__name__}): {BASE_FIX}"
            ) from None
    if not (folder / "config.json").is_file() or not list(folder.glob("model*.safetensors")):
        raise ValueError(
            f"mlx-lm loads a folder with config.json and model*.safetensors; the base {folder} has "
            "not both: save it with save_pretrained"
        )
    return folder


def rope_keys(config: dict[str, Any]) -> dict[str, Any]:
    """``rope_theta`` (and ``rope_scaling`` for a scaled rope) as mlx-lm's models read them: at the
    top of config.json. transformers 5 writes them inside ``rope_parameters``, which mlx-lm 0.32
    does not read: such a base runs at mlx-lm's default theta (10000), whatever its own (SmolLM2's
    100000 gave 92 % top-1 agreement, max |logit difference| 8.5). Empty where nothing is missing."""
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_theta" in config or "rope_theta" not in rope:
        return {}
    keys: dict[str, Any] = {"rope_theta": rope["rope_theta"]}
    if rope.get("rope_type", "default") != "default":
        keys["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    return keys


def mlx_model_skeleton(base: Path) -> Any:
    """mlx-lm's model for the base's config, without its weights (mlx builds lazily)."""
    from mlx_lm.utils import _get_classes, load_config

    config = load_config(base)
    try:
        model_class, args_class = _get_classes(config)
    except ValueError:
        raise ValueError(
            f"mlx-lm has no model for the base's model_type {config.get('model_type')!r} "
            f"({base}): --format mlx needs an architecture mlx-lm loads, such as llama"
        ) from None
    return model_class(args_class.from_dict(config))


def mlx_adapter(adapter: Path, base: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(tensors, adapter_config.json) of the mlx-lm adapter for the peft ``adapter`` folder."""
    import mlx.core as mx

    peft = json.loads((adapter / "adapter_config.json").read_text())
    parameters = mlx_lora_parameters(peft)
    weights = mx.load(str(adapter / PEFT_WEIGHTS))
    tensors, layers, keys = mlx_tensors(weights, parameters["rank"])
    model = mlx_model_skeleton(base)
    check_modules(model, tensors)
    config = {
        "fine_tune_type": "lora",
        "model": str(base),
        "num_layers": len(model.layers) - layers[0],  # mlx-lm adapts the last num_layers blocks
        "lora_parameters": {**parameters, "keys": keys},
    }
    return tensors, config


def _write_adapter(folder: Path, tensors: dict[str, Any], config: dict[str, Any]) -> None:
    import mlx.core as mx

    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / ADAPTER_WEIGHTS), tensors, metadata={"format": "mlx"})
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")


def _write_fused(
    folder: Path, base: Path, adapter: tuple[dict, dict], tokenizer: Any, bits: int | None
) -> str:
    """mlx-lm's fuse of the base and adapter (as ``mlx_lm fuse``), quantized to ``bits`` by
    mlx-lm's quantizer, saved by mlx-lm; the weights' description."""
    from mlx.utils import tree_flatten, tree_unflatten
    from mlx_lm.utils import (
        compute_bits_per_weight,
        load_adapters,
        load_config,
        load_model,
        quantize_model,
        save,
    )

    # as mlx_lm.load, less the base's tokenizer (the run's is saved), with the rope where mlx-lm
    # reads it (then saved in config.json)
    model, config = load_model(base, model_config=rope_keys(load_config(base)))
    with tempfile.TemporaryDirectory() as scratch:
        _write_adapter(Path(scratch), *adapter)
        load_adapters(model, scratch)
    fused = [(name, m.fuse()) for name, m in model.named_modules() if hasattr(m, "fuse")]
    model.update_modules(tree_unflatten(fused))
    dtype = str(tree_flatten(model.parameters())[0][1].dtype)
    if bits is not None:
        with contextlib.redirect_stdout(sys.stderr):  # its "[INFO] Quantized ..." line
            model, config = quantize_model(model, config, group_size=None, bits=bits)
        dtype = f"{bits}-bit, {compute_bits_per_weight(model):.2f} bits per weight"
    save(folder, str(base), model, tokenizer, config, donate_model=False)
    return dtype.replace("mlx.core.", "")


def export_mlx(
    path: str | Path,
    out: str | Path | None = None,
    fuse: bool = False,
    quant: str | None = None,
    force: bool = False,
) -> MlxExport:
    """The run's (or adapter folder's) adapter as an mlx-lm adapter folder, or with ``fuse`` a
    fused mlx-lm model folder (``quant``: 4bit or 8bit); see the module. Everything that can
    refuse does so before anything is written."""
    import laptrain.families.lora.tools as lora_tools
    from laptrain.families.lora.gguf.write import refuse_non_lora

    check_quant(quant, fuse)
    import_mlx_lm()
    path = Path(path)
    refuse_non_lora(path, "mlx")
    adapter = lora_tools.find_adapter(path)
    if adapter.parent.name == "adapters":
        lora_tools._note(
            f"{path} has no adapter/ yet (still training, or stopped before its end): exporting "
            f"its newest step adapter, {adapter}"
        )
    name = lora_tools.base_name_of(adapter)
    revision = lora_tools._read_json(adapter / "adapter_config.json").get("revision")
    kind = f"mlx-fused-{quant}" if quant else "mlx-fused" if fuse else "mlx"
    target = export_target(out or default_export_dir(adapter, kind), "mlx", (adapter, name), force)
    base = base_folder(name, revision)
    tensors, config = mlx_adapter(adapter, base)
    if fuse:
        return _export_fused(adapter, base, target, (tensors, config), quant)
    target.check_space(sum(t.nbytes for t in tensors.values()))
    folder = target.write(lambda f: _write_adapter(f, tensors, config))
    lora = config["lora_parameters"]
    what = f"rank {lora['rank']}, scale {lora['scale']:g}, {config['num_layers']} layers"
    rope = rope_keys(lora_tools._read_json(base / "config.json"))
    if rope:
        lora_tools._note(
            "the base's config.json keeps its rope inside rope_parameters, which mlx-lm does not "
            f"read: load it with mlx_lm.load(BASE, adapter_path=DIR, model_config={rope}), or "
            "export with --fuse (its config.json has them where mlx-lm reads them)"
        )
    run_it = f"mlx_lm.generate --model {base} --adapter-path {folder} --prompt ..."
    return MlxExport(folder, f"MLX adapter ({what})", run_it)


def _export_fused(
    adapter: Path, base: Path, target: Any, mlx: tuple[dict, dict], quant: str | None
) -> MlxExport:
    """The fused folder, after the memory check of the base's weights (at their stored size) and
    the disk check."""
    import laptrain.families.lora.tools as lora_tools

    stored = lora_tools._read_json(base / "config.json")
    stored = stored.get("dtype") or stored.get("torch_dtype")
    dtype = "bfloat16" if stored in ("bfloat16", "float16") else "float32"  # the size counts
    lora_tools.checked_plan(lora_tools.read_record(adapter), str(base), "cpu", dtype, None, False)
    target.check_space(sum(f.stat().st_size for f in base.glob("model*.safetensors")))
    tokenizer = lora_tools._load_tokenizer(adapter, str(base))
    described: list[str] = []

    def write(folder: Path) -> None:
        bits = MLX_QUANTS.get(quant or "")
        described.append(_write_fused(folder, base, mlx, tokenizer, bits))

    folder = target.write(write)
    run_it = f"mlx_lm.generate --model {folder} --prompt ..."
    return MlxExport(folder, f"MLX model ({described[0]})", run_it)
