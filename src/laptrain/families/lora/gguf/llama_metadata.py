"""A Llama config's hyperparameters as the GGUF keys llama.cpp reads for ``general.architecture =
llama``, and Llama 3's rope scaling as the ``rope_freqs`` tensor llama.cpp expects.

transformers 5 keeps rope settings in ``config.rope_parameters`` (``rope_theta``, ``rope_type``
and, for ``llama3``, ``factor``/``low_freq_factor``/``high_freq_factor``/
``original_max_position_embeddings``); older configs use ``rope_theta`` and ``rope_scaling``.
Rope types other than ``default`` and ``llama3`` are refused: llama.cpp would run the model
without them and answer worse with no error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ARCHITECTURES = ("LlamaForCausalLM",)
SUPPORTED = "Llama-family models (LlamaForCausalLM: SmolLM2, Llama 3.x)"


def check_architecture(config: Any) -> None:
    archs = list(getattr(config, "architectures", None) or [])
    if getattr(config, "model_type", None) != "llama" or not set(archs) <= set(ARCHITECTURES):
        name = archs[0] if archs else getattr(config, "model_type", "unknown")
        raise ValueError(
            f"--format gguf writes {SUPPORTED} only; this run's base is {name}: export it as a "
            "transformers folder instead (laptrain export <run>, without --format gguf)"
        )


def rope_settings(config: Any) -> dict[str, Any]:
    """``rope_theta``, ``rope_type`` and the type's own keys, from either config layout."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    legacy = dict(getattr(config, "rope_scaling", None) or {})
    settings = {**legacy, **params}
    settings.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    settings["rope_type"] = settings.get("rope_type") or settings.get("type") or "default"
    return settings


def head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def llama3_rope_factors(config: Any) -> np.ndarray:
    """The per-frequency divisors of Llama 3's rope scaling (llama.cpp's ``rope_freqs``): 1 for
    wavelengths shorter than ``original / high_freq_factor``, ``factor`` for those longer than
    ``original / low_freq_factor``, a smooth blend between."""
    rope = rope_settings(config)
    base, dim = float(rope["rope_theta"]), head_dim(config)
    factor = float(rope["factor"])
    low, high = float(rope["low_freq_factor"]), float(rope["high_freq_factor"])
    original = float(rope["original_max_position_embeddings"])
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for i in range(0, dim, 2):
        wavelen = 2 * math.pi * base ** (i / dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


def check_config(config: Any) -> None:
    """Refuse (one line) a config whose model llama.cpp would not run as transformers does."""
    check_architecture(config)
    rope = rope_settings(config)["rope_type"]
    if rope not in ("default", "llama3"):
        raise ValueError(
            f"rope_type {rope!r} is not written to GGUF by laptrain (default and llama3 are): "
            "export a transformers folder instead (without --format gguf)"
        )


def add_llama_metadata(writer: Any, config: Any, name: str, file_type: int) -> np.ndarray | None:
    """Write the hyperparameter keys; returns the ``rope_freqs`` tensor when the rope needs one."""
    check_config(config)
    rope = rope_settings(config)
    writer.add_name(name)
    writer.add_file_type(int(file_type))
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_feed_forward_length(int(config.intermediate_size))
    writer.add_head_count(int(config.num_attention_heads))
    writer.add_head_count_kv(int(config.num_key_value_heads or config.num_attention_heads))
    writer.add_rope_dimension_count(int(head_dim(config)))
    writer.add_rope_freq_base(float(rope["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    if head_dim(config) != config.hidden_size // config.num_attention_heads:
        writer.add_key_length(int(head_dim(config)))
        writer.add_value_length(int(head_dim(config)))
    return llama3_rope_factors(config) if rope["rope_type"] == "llama3" else None
