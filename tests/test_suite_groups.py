"""The fast suite's scheduling (tests/conftest.py): the tests of a module-scoped fixture run on one
xdist worker, so a trained run or a built model is made once per suite, not once per worker."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def built_once() -> list[str]:
    return []


def test_a_module_fixture_s_tests_are_scheduled_as_one_group(request, built_once):
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("runs under xdist's --dist loadgroup (the default addopts)")
    # loadgroup sends every node id ending in the same `@group` to one worker
    assert request.node.nodeid.endswith("@tests.test_suite_groups"), request.node.nodeid
