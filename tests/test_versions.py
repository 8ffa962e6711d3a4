"""One list of package versions for the report, the doctor and the device smoke header."""

from __future__ import annotations

from importlib import metadata

from laptrain.versions import PACKAGES, package_versions


def test_versions_come_from_the_installed_metadata():
    found = package_versions()
    assert {"python", "laptrain", "torch", "lightning", "transformers", "hydra"} <= found.keys()
    assert found["hydra"] == metadata.version("hydra-core")
    assert found["torch"] == metadata.version("torch")


def test_a_missing_package_is_left_out(monkeypatch):
    monkeypatch.setitem(PACKAGES, "nope", "laptrain-no-such-distribution")
    assert "nope" not in package_versions()
