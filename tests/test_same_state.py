"""The checkpoint comparison the resume tests use sees what ``repr`` hides."""

from __future__ import annotations

import pytest
import torch

from tests.same_state import assert_same, differences


def adam_state(inner: float) -> dict:
    moment = torch.zeros(100, 100)
    moment[50, 50] = inner  # deep inside: repr shows only the edges of a 100 x 100 tensor
    return {
        "state": {0: {"step": torch.tensor(3.0), "exp_avg": moment}},
        "param_groups": [{"lr": 1e-3}],
    }


def test_a_difference_repr_hides_is_found_with_its_path():
    a, b = adam_state(0.0), adam_state(1e-7)
    assert repr(a) == repr(b)  # what the old comparison saw
    assert differences(a, b) == ["state.0.exp_avg"]
    with pytest.raises(AssertionError, match="exp_avg"):
        assert_same([a], [b], "optimizer_states")


def test_equal_states_dtypes_and_plain_values():
    assert_same(adam_state(2.0), adam_state(2.0))
    assert differences(torch.ones(2), torch.ones(2, dtype=torch.float64)) == ["<tensor>"]
    assert differences({"lr": 1e-3}, {"lr": 2e-3}) == ["lr: 0.001 != 0.002"]
    assert differences({"a": 1}, {"b": 1}) == [" keys ['a', 'b']"]
