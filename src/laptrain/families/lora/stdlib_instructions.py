"""Offline instruction pairs from the standard library: "What does `mod.func` do?" -> first sentence.

Like ``stdlib_docstrings``, the sources are parsed with ``ast`` and never imported. Every public
top-level function and class with a docstring gives one pair; the answer is the first sentence of
the docstring's first paragraph. Each row carries its module, and ``conf/data/
stdlib_instructions.yaml`` splits by it (``group_column: module``), so no module is in two splits:
held-out loss then measures answers about unseen modules, not near-copies of trained ones.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import sysconfig
from pathlib import Path

from laptrain.families.classifier.stdlib_docstrings import _source_files, write_jsonl

_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(doc: str) -> str:
    """The first sentence of the first paragraph, whitespace collapsed."""
    paragraph = doc.strip().split("\n\n", 1)[0]
    text = " ".join(paragraph.split())
    end = _SENTENCE_END.search(text)
    return text[: end.start()] if end else text


def collect_pairs(
    modules: list[str], min_chars: int = 12, max_chars: int = 200, stdlib: Path | None = None
) -> list[dict[str, str]]:
    """``{"prompt", "response", "module"}`` for every public top-level function or class."""
    stdlib = Path(stdlib or sysconfig.get_paths()["stdlib"])
    rows: list[dict[str, str]] = []
    seen: set[str] = set()
    for top in modules:
        for path in _source_files(stdlib, top):
            parts = path.relative_to(stdlib).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts):
                continue
            module = ".".join(parts)
            try:
                tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            except (SyntaxError, UnicodeDecodeError, OSError):
                continue
            for node in tree.body:
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                name = f"{module}.{node.name}"
                doc = ast.get_docstring(node)
                if node.name.startswith("_") or not doc or name in seen:
                    continue
                answer = first_sentence(doc)
                if not (min_chars <= len(answer) <= max_chars) or answer.endswith(":"):
                    continue
                seen.add(name)
                rows.append(
                    {"prompt": f"What does `{name}` do?", "response": answer, "module": module}
                )
    return rows


def build_stdlib_instructions(
    cache_dir: str, modules: list[str], min_chars: int = 12, max_chars: int = 200
) -> dict[str, str]:
    """Write the pairs to ``<cache_dir>/stdlib_instructions/<key>.jsonl`` once; return ``{"all": path}``.

    The key covers the Python version, the module list and the length limits.
    """
    modules = [str(m) for m in modules]
    if not modules:
        raise ValueError(
            "data.builder.modules is empty: list stdlib modules in conf/data/stdlib_instructions.yaml"
        )
    spec = json.dumps(
        {"python": sys.version, "modules": modules, "chars": [min_chars, max_chars]},
        sort_keys=True,
    )
    key = hashlib.sha256(spec.encode()).hexdigest()[:16]
    out = Path(cache_dir) / "stdlib_instructions" / f"{key}.jsonl"
    if not out.exists():
        rows = collect_pairs(modules, min_chars=min_chars, max_chars=max_chars)
        if not rows:
            raise FileNotFoundError(
                f"no documented functions found under {sysconfig.get_paths()['stdlib']} for "
                f"{', '.join(modules)}: this Python ships without its standard library sources, or "
                "the modules are wrong; use data=instructions with your own file"
            )
        write_jsonl(out, rows)
    return {"all": str(out)}
