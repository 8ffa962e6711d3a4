"""An offline text-classification corpus: the standard library's docstrings, labelled by family.

Every Python install carries its standard library as source, so this data set exists on a fresh
machine with no dataset hub. Each example is the docstring of a module, class or function; its
label is the family its top-level module belongs to (text, networking, concurrency, ...), taken
from the ``families`` map in ``conf/data/stdlib_docstrings.yaml``. Sources are parsed with ``ast``,
never imported (importing ``antigravity`` opens a browser; others print or need a display).

The corpus is written once as JSONL under the cache folder, keyed by Python version and the family
map, and then read like any user's JSONL file.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sys
import sysconfig
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from laptrain.files import write_text_atomic


def _docstrings(tree: ast.Module) -> Iterator[str]:
    module_doc = ast.get_docstring(tree)
    if module_doc:
        yield module_doc
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            doc = ast.get_docstring(node)
            if doc:
                yield doc


def _source_files(stdlib: Path, top: str) -> list[Path]:
    package = stdlib / top
    if package.is_dir():
        return sorted(p for p in package.rglob("*.py") if "test" not in p.relative_to(stdlib).parts)
    module = stdlib / f"{top}.py"
    return [module] if module.is_file() else []


def collect_examples(
    families: Mapping[str, list[str]], min_chars: int = 20, stdlib: Path | None = None
) -> list[dict[str, str]]:
    """Return ``{"text", "label", "module"}`` rows for every docstring of the listed modules."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for label, modules in families.items():
        for top in modules:
            for path in _source_files(stdlib, top):
                try:
                    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
                except (SyntaxError, UnicodeDecodeError, OSError):
                    continue
                module = ".".join(path.relative_to(stdlib).with_suffix("").parts)
                for doc in _docstrings(tree):
                    text = " ".join(doc.split())
                    if len(text) < min_chars or text in seen:
                        continue
                    seen.add(text)
                    rows.append({"text": text, "label": label, "module": module})
    return rows


def build_stdlib_docstrings(
    cache_dir: str, families: Mapping[str, list[str]], min_chars: int = 20
) -> dict[str, str]:
    """Write the corpus to ``<cache_dir>/stdlib_docstrings/<key>.jsonl`` once; return ``{"all": path}``.

    The key covers the Python version and the family map, so editing the map builds a new file.
    """
    families = {str(k): [str(m) for m in v] for k, v in families.items()}
    if not families:
        raise ValueError(
            "data.builder.families is empty: list module families in conf/data/stdlib_docstrings.yaml"
        )
    spec = json.dumps(
        {"python": sys.version, "families": families, "min_chars": min_chars}, sort_keys=True
    )
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    out = Path(cache_dir) / "stdlib_docstrings" / f"{key}.jsonl"
    if not out.exists():
        rows = collect_examples(families, min_chars=min_chars)
        if not rows:
            raise FileNotFoundError(
                f"no docstrings found under {sysconfig.get_paths()['stdlib']}: this Python ships "
                "without its standard library sources; use data=text_csv with your own file"
            )
        write_jsonl(out, rows)
    return {"all": str(out)}


def write_jsonl(out: Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows as JSON lines through a temporary file, so a reader never sees half a file."""
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, "".join(json.dumps(row) + "\n" for row in rows))
