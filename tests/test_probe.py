import pytest

from laptrain.hardware.probe import DeviceProbe, MemoryReading, TorchProbe, probe_for
from tests.fakes import FakeProbe


def test_cpu_probe_reads_host_memory_and_no_device_figures():
    reading = TorchProbe("cpu").memory()
    assert reading.rss > 0
    assert reading.system_total >= reading.system_available > 0
    assert reading.device_allocated is None and reading.device_limit is None


def test_probe_for_parses_device_strings():
    assert probe_for("cuda:1").kind == "cuda"
    assert probe_for("cuda:1").index == 1
    assert probe_for("mps").kind == "mps"
    assert probe_for("meta").kind == "cpu"


def test_unknown_kind_is_refused_with_the_choices():
    with pytest.raises(ValueError, match="cpu, cuda, mps"):
        TorchProbe("tpu")


def test_fake_probe_replays_readings_and_records_calls():
    first = MemoryReading(
        rss=1, system_total=10, system_available=9, system_percent=10.0, swap_used=0
    )
    second = MemoryReading(
        rss=2,
        system_total=10,
        system_available=8,
        system_percent=20.0,
        swap_used=5,
        device_allocated=3,
        device_limit=7,
    )
    probe = FakeProbe(kind="mps", readings=[first, second])
    assert isinstance(probe, DeviceProbe)
    assert probe.memory().rss == 1
    assert probe.memory().device_allocated == 3
    assert probe.memory().swap_used == 5  # the last reading repeats
    probe.empty_cache()
    assert probe.calls == ["memory", "memory", "memory", "empty_cache"]


def test_pre_ampere_gpu_has_no_bf16_even_though_torch_can_emulate_it(monkeypatch):
    """A T4/V100 stand-in: compute capability 7.x, and a bf16 tensor can be created (emulation).
    torch's default ``is_bf16_supported()`` says True there; the probe must say False."""
    import types

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(major=7)
    )
    monkeypatch.setattr(torch.cuda, "_check_bf16_tensor_supported", lambda device: True)
    assert torch.cuda.is_bf16_supported()  # torch counts emulation
    assert TorchProbe("cuda").bf16_supported() is False
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(major=8)
    )
    assert TorchProbe("cuda").bf16_supported() is True
