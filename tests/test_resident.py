"""The parameter bytes the preflight takes off the process's resident set (preflight/resident.py)."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from laptrain.preflight.resident import FileMapping, file_mappings, resident_parameter_bytes

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")


def test_built_parameters_count_whole_and_shared_storage_once():
    model = nn.Linear(256, 256)
    model.extra = nn.Parameter(model.weight.detach().view(-1)[:10])  # a view: same storage
    whole = 256 * 256 * 4 + 256 * 4
    assert resident_parameter_bytes(model, file_mappings()) == whole
    assert resident_parameter_bytes(model, None) == whole  # no /proc: as before


def test_a_parameter_in_a_mapped_file_counts_with_the_mapping_resident_bytes():
    model = nn.Linear(4, 4)
    pointer = model.weight.untyped_storage().data_ptr()
    mapping = FileMapping(pointer, pointer + 4 * 4 * 4, resident=8192)  # the weight alone
    assert resident_parameter_bytes(model, [mapping]) == 8192 + 4 * 4  # the bias is elsewhere


@linux
def test_weights_loaded_from_safetensors_are_resident_only_once_read(tmp_path):
    """What transformers' from_pretrained does with a safetensors file: tensors used in place
    from the mapping, so pages count only once read."""
    path = tmp_path / "w.safetensors"
    save_file({"weight": torch.randn(4096, 1024)}, str(path))  # 16 MiB
    model = nn.Linear(1024, 4096, bias=False)
    model.weight = nn.Parameter(load_file(str(path))["weight"], requires_grad=False)
    before = resident_parameter_bytes(model, file_mappings())
    float(model.weight.sum())  # reads every page
    after = resident_parameter_bytes(model, file_mappings())
    assert after >= 16 * 2**20
    if before < 16 * 2**20:  # safetensors mapped the file (else it copied: whole either way)
        assert after - before > 8 * 2**20


@linux
def test_smaps_lists_file_mappings_sorted_with_their_resident_bytes():
    mappings = file_mappings()
    assert mappings and all(a.start < b.start for a, b in zip(mappings, mappings[1:]))
    assert any(m.resident > 0 for m in mappings)  # the Python binary and torch's libraries
