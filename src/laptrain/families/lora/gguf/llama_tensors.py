"""transformers Llama tensors as GGUF tensors: names, the q/k row order, and each tensor's type.

GGUF names come from the ``gguf`` package's own map (``gguf.get_tensor_name_map``). Two layout
facts are llama.cpp's, not the package's:

- llama.cpp's rope rotates adjacent pairs of a head's dimensions, transformers' Llama rotates the
  first half against the second. llama.cpp's converter therefore reorders the rows of
  ``q_proj``/``k_proj`` per head (:func:`interleave_rope_rows`); transformers' GGUF loader undoes
  exactly that when it reads a Llama GGUF.
- 1-D tensors (the RMS norms) stay float32 whatever the file type, and a quantised type applies
  only to a matrix whose row length is a multiple of the type's block size (32 for q8_0/q4_0);
  others fall back to float16.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np
import torch

QUANTS = ("f16", "q8_0", "q4_0")  # what ``gguf.quants`` can write; K-quants it only reads


# --quant -> (the GGML type of its matrices, the file type it declares), by gguf's enum names
QUANT_TYPES = {"f16": ("F16", "MOSTLY_F16"), "q8_0": ("Q8_0", "MOSTLY_Q8_0"),
               "q4_0": ("Q4_0", "MOSTLY_Q4_0")}  # fmt: skip


def qtype_of(quant: str) -> object:
    import gguf

    return gguf.GGMLQuantizationType[QUANT_TYPES[quant][0]]


def file_type_of(quant: str) -> int:
    import gguf

    return gguf.LlamaFileType[QUANT_TYPES[quant][1]]


def interleave_rope_rows(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Rows of a q/k projection reordered from rotate-half to llama.cpp's adjacent-pair rope:
    within each head, row ``i`` of the first half and row ``i`` of the second become neighbours."""
    rows = weight.shape[0]
    return (
        weight.reshape(n_head, 2, rows // n_head // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def tensor_type(name: str, data: np.ndarray, quant: str, tied: bool = False) -> object:
    """The GGML type one tensor is written in for file type ``quant``.

    The output head (``output.weight``, or ``token_embd.weight`` when the head is tied to it) stays
    float16 in a quantised file: every next-token log-probability goes through it, and quantising
    it cost SmolLM2's q8_0 file 1.1 % perplexity against 0.0x % for the rest (docs/gguf_export.md);
    llama.cpp's own ``llama-quantize`` also gives the head a wider type than the other matrices."""
    import gguf

    if data.ndim <= 1:
        return gguf.GGMLQuantizationType.F32
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return gguf.GGMLQuantizationType.F16
    qtype = qtype_of(quant)
    block, _ = gguf.GGML_QUANT_SIZES[qtype]
    if data.shape[-1] % block:
        return gguf.GGMLQuantizationType.F16
    return qtype


def written_bytes(shape: tuple[int, ...], qtype: object) -> int:
    """Bytes a tensor of ``shape`` takes in the file as ``qtype`` (before alignment padding)."""
    import gguf

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    count = int(np.prod(shape))
    return count // block * size


def gguf_name(hf_name: str, n_blocks: int) -> str:
    """The GGUF name of a transformers Llama tensor (``model.layers.3.mlp.up_proj.weight`` ->
    ``blk.3.ffn_up.weight``); ValueError for a tensor the map does not know."""
    import gguf

    mapped = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, n_blocks).get_name(
        hf_name, try_suffixes=(".weight", ".bias")
    )
    if mapped is None:
        raise ValueError(f"no GGUF name for tensor {hf_name}: laptrain writes Llama models only")
    return mapped


def llama_tensors(
    state: Mapping[str, torch.Tensor], config: object, quant: str
) -> Iterator[tuple[str, np.ndarray, object]]:
    """``(gguf name, float32 array in GGUF layout, type)`` for each tensor of a merged Llama.

    A tied output head is left out (llama.cpp reads ``token_embd`` for it, as transformers
    ties it); rotary caches are buffers, not parameters, and are not in ``state``."""
    n_head = config.num_attention_heads
    n_kv = config.num_key_value_heads or n_head
    n_blocks = config.num_hidden_layers
    tied = bool(getattr(config, "tie_word_embeddings", False))
    for hf_name, tensor in state.items():
        if tied and hf_name == "lm_head.weight":
            continue
        weight = tensor.detach().to("cpu", torch.float32)
        if hf_name.endswith("self_attn.q_proj.weight"):
            weight = interleave_rope_rows(weight, n_head)
        elif hf_name.endswith("self_attn.k_proj.weight"):
            weight = interleave_rope_rows(weight, n_kv)
        data = weight.numpy()
        name = gguf_name(hf_name, n_blocks)
        yield name, data, tensor_type(name, data, quant, tied)


def encode(data: np.ndarray, qtype: object) -> np.ndarray:
    """``data`` (float32) in the bytes of ``qtype``, through ``gguf.quants``.

    A quantised type is computed from the values rounded to float16 first, as llama.cpp's own
    ``llama-quantize`` computes it from an f16 file: the q8_0 and q4_0 files are then, tensor for
    tensor, what ``llama-quantize`` makes of laptrain's f16 export (the slow test checks it through
    llama-cpp-python's ``llama_model_quantize``), so a user gets the file the reference tool gives.
    Quantising the float32 values directly gives blocks that differ in the last bit of some scales
    and values; on SmolLM2-135M that moved llama.cpp's whole-text perplexity by 2 % (docs/gguf_export.md)."""
    import gguf

    if qtype not in (gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32):
        data = data.astype(np.float16).astype(np.float32)
    return gguf.quants.quantize(data, qtype)
