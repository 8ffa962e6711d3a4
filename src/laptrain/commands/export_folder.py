"""Where an export (every format) may write: :func:`export_target`. An export replaces its folder
whole, so only one an earlier export wrote (:data:`EXPORT_MARKER`), an empty or missing one, or
with ``--force`` any other may be replaced; one that is, holds or lies inside a model being read
is refused even then (a base model folder holds a ``config.json`` too)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from laptrain.files import write_folder_atomic

EXPORT_MARKER = "laptrain-export.json"
GiB = 1024**3
# Beyond the weights: the header and tokenizer files (~10 MB for a 128k vocabulary), alignment
# padding, and room for the filesystem not to end up full.
DISK_HEADROOM = 64 * 1024**2
FIX = "free some space, or give --out on another disk"


@dataclass(frozen=True)
class ExportTarget:
    """An output folder :func:`export_target` cleared, and how to write into it."""

    folder: Path
    form: str
    reading: tuple[Path, ...] = ()
    force: bool = False

    def write(self, write: Callable[[Path], object]) -> Path:
        """``write(folder)`` beside the target, the marker added, then swapped in whole
        (:func:`laptrain.files.write_folder_atomic`); the rule is checked again first, since
        loading the model may have taken minutes."""
        export_target(self.folder, self.form, self.reading, self.force)

        def marked(folder: Path) -> None:
            write(folder)
            (folder / EXPORT_MARKER).write_text(json.dumps({"format": self.form}) + "\n")

        return write_folder_atomic(self.folder, marked, replace=True, fix=FIX)

    def check_space(self, need: int) -> None:
        """Refuse (one line) an export of ``need`` bytes where the disk has less free, plus
        :data:`DISK_HEADROOM`, before anything is written."""
        probe = _where(self.folder).parent
        while not probe.exists():
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < need + DISK_HEADROOM:
            raise ValueError(
                f"not enough disk for the export: it needs {need / GiB:.2f} GiB (+ "
                f"{DISK_HEADROOM // 1024**2} MiB headroom), {probe} has {free / GiB:.2f} GiB "
                f"free: {FIX}"
            )


def _where(path: Path) -> Path:
    """``path`` with its parent's links resolved; a link at ``path`` itself is replaced by the
    export, never written through, so it is not followed."""
    return path.parent.resolve() / path.name


def export_target(
    out: str | Path,
    form: str,
    reading: Iterable[str | Path] = (),
    force: bool = False,
) -> ExportTarget:
    """The folder ``out`` cleared for an export of format ``form`` (its marker records it), or a
    one-line ValueError: ``out`` is a file; is, contains or lies inside a folder in ``reading``
    (the base and adapter being read); or holds files no export wrote and ``force`` is not set."""
    target = _where(Path(out))
    sources = tuple(_where(Path(p)) for p in reading if Path(p).exists())
    for source in sources:
        if target == source or source.is_relative_to(target) or target.is_relative_to(source):
            raise ValueError(
                f"--out {out} is, contains or lies inside {source}, which this export reads: "
                "choose an output folder outside it"
            )
    link = Path(out).is_symlink()
    if target.exists() and not link and not target.is_dir():
        raise ValueError(f"--out {out} is a file: give --out a folder")
    foreign = (
        not link
        and target.is_dir()
        and any(target.iterdir())
        and not (target / EXPORT_MARKER).is_file()
    )
    if foreign and not force:
        raise ValueError(
            f"--out {out} holds files laptrain export did not write (no {EXPORT_MARKER}): "
            "choose another folder, or add --force to replace it"
        )
    return ExportTarget(Path(out), form, sources, force)
