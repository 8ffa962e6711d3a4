"""laptrain.hardware.malloc: ``hardware.malloc_keep_freed`` calls glibc's mallopt with the
constants of glibc's malloc.h, only where glibc is, and only when on."""

from __future__ import annotations

import subprocess
import sys

import pytest

from laptrain.hardware import malloc
from laptrain.hardware.malloc import keep_freed


class FakeLibc:
    """Records mallopt calls; answers ``result`` (1: glibc's success)."""

    def __init__(self, result: int = 1) -> None:
        self.calls: list[tuple[int, int]] = []
        self.result = result

    def mallopt(self, param: int, value: int) -> int:
        self.calls.append((param, value))
        return self.result


def test_on_glibc_it_disables_mmap_and_trimming_with_malloc_h_constants():
    libc = FakeLibc()
    assert keep_freed(True, libc, environ={}, version="glibc 2.36") == "applied"
    # malloc.h: M_MMAP_MAX -4 (0: no mmap), M_TRIM_THRESHOLD -1 (-1: never trim; mallopt(3))
    assert libc.calls == [(-4, 0), (-1, -1)]


@pytest.mark.parametrize("value", [False, None, "true", 1])
def test_off_or_not_a_bool_makes_no_call(value):
    libc = FakeLibc()
    assert keep_freed(value, libc, environ={}, version="glibc 2.36") == "off"
    assert libc.calls == []


def test_without_glibc_it_is_a_no_op(monkeypatch):
    monkeypatch.setattr(malloc, "glibc_version", lambda: None)  # macOS, musl, Windows
    libc = FakeLibc()
    assert keep_freed(True, libc, environ={}) == "no glibc (a no-op here)"
    assert libc.calls == []


@pytest.mark.parametrize(
    "environ",
    [{"MALLOC_MMAP_THRESHOLD_": "65536"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}],
)
def test_the_users_own_malloc_variables_win(environ):
    libc = FakeLibc()
    assert "glibc uses yours" in keep_freed(True, libc, environ=environ, version="glibc 2.36")
    assert libc.calls == []


def test_a_refused_call_is_reported_not_raised():
    assert keep_freed(True, FakeLibc(0), environ={}, version="glibc 2.36").startswith("mallopt")


CHILD = """
import ctypes, os, sys
from laptrain.hardware.malloc import glibc_version, keep_freed
if glibc_version() is None:
    print("skip"); sys.exit()
env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
on = sys.argv[1] == "on"
assert keep_freed(on, environ=env) == ("applied" if on else "off")
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 256 * 2**20
block = libc.malloc(size)
ctypes.memset(block, 1, size)
before = rss()
libc.free(block)
print(before - rss())
"""


def shrink_after_free(setting: str) -> str:
    """Bytes the process's RSS shrank by after freeing a touched 256 MiB block (fresh process)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, setting], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_in_a_fresh_process_a_large_free_no_longer_shrinks_rss():
    off = shrink_after_free("off")
    if off == "skip":
        pytest.skip("no glibc here")
    assert int(off) > 200 * 2**20  # glibc's default: the block was mmapped, free unmaps it
    assert int(shrink_after_free("on")) < 2**20  # kept: from the heap, never trimmed


@pytest.mark.parametrize("value", [True, False])
def test_the_launch_applies_the_profiles_setting(monkeypatch, value):
    from omegaconf import OmegaConf

    from laptrain.launch import prepare

    seen = []
    monkeypatch.setattr(prepare, "keep_freed", seen.append)
    cfg = OmegaConf.create({"hardware": {"env": {}, "malloc_keep_freed": value}})
    prepare.apply_profile_env(cfg, say=lambda _: None)
    assert seen == [value]
