"""Functions a reader can hold in view: none over 50 lines in the run's planning (``job/``,
``preflight/``), and a handful at most in the whole package."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "laptrain"
LONGEST = 50
LONG_ONES_ALLOWED = 4


def long_functions(folder: Path) -> list[str]:
    """``path:name (lines)`` of every function in ``folder`` longer than :data:`LONGEST` lines."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > LONGEST:
                    found.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines})")
    return found


def test_no_function_in_job_or_preflight_is_over_50_lines():
    assert long_functions(PACKAGE / "job") + long_functions(PACKAGE / "preflight") == []


def test_few_functions_in_the_package_are_over_50_lines():
    assert len(long_functions(PACKAGE)) <= LONG_ONES_ALLOWED, long_functions(PACKAGE)
