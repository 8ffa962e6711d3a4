"""The package's floor plan (drawn in docs/architecture.md, rooms in CONTRIBUTING.md): every import goes to the same floor or one below,
there are no import circles, and the top of ``src/laptrain/`` stays a short hall.

Imports inside functions count too: a lazy import that runs upward is still an arrow that a reader
has to follow, and a circle hidden in a function is still a circle."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "laptrain"

# Bottom to top. A module imports only from its own floor or a lower one.
FLOORS = [
    {
        ""
    },  # project, console, versions, files, family: the ground floor, importing no laptrain module
    {"config", "loggers", "checkpoints"},  # checkpoints: run_folder's readers find last.ckpt there
    {"hardware", "run_folder", "ranks"},
    {"pretrained"},
    {"data"},
    {"callbacks"},
    {"model"},
    {"preflight"},
    {"launch"},
    {"job"},
    {"commands"},
    {"families"},  # the wings: each imports any engine room, and no engine room imports one
]
TOP_MODULES_MAX = (
    7  # __init__ and the ground floor: console, exit_codes, family, files, project, versions
)


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports() -> dict[str, set[str]]:
    """``{module: laptrain modules it imports}``, every import statement counted."""
    mods = modules()
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in mods:
                    target = target.rpartition(".")[0]
                if target and target not in (name, "laptrain"):
                    edges[name].add(target)
    return edges


def floor(module: str) -> int:
    parts = module.split(".")
    room = parts[1] if len(parts) > 2 or (PACKAGE / parts[1]).is_dir() else ""
    for level, rooms in enumerate(FLOORS):
        if room in rooms:
            return level
    raise AssertionError(f"{module}: its package {room!r} is on no floor of FLOORS")


def test_every_package_is_on_a_floor() -> None:
    for module in modules():
        if module != "laptrain":
            floor(module)


def test_no_import_runs_upward() -> None:
    upward = [
        f"{src} (floor {floor(src)}) imports {dst} (floor {floor(dst)})"
        for src, targets in imports().items()
        for dst in targets
        if floor(dst) > floor(src)
    ]
    assert upward == []


def test_no_import_circles() -> None:
    edges = imports()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                circles.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for module in sorted(modules()):
        if module not in state:
            visit(module, [module])
    assert circles == []


def test_the_top_of_the_package_is_a_short_hall() -> None:
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= TOP_MODULES_MAX, top


def test_the_ground_floor_imports_no_laptrain_module() -> None:
    ground = {m: t for m, t in imports().items() if floor(m) == 0}
    assert all(not targets for targets in ground.values()), ground
