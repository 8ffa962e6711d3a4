"""``laptrain new NAME``: a working model and data of your own, ready to edit (docs/your_model.md).

The files come from ``laptrain/templates/new/`` with ``{{name}}`` and ``{{cls}}`` replaced:
cookiecutter or copier would be a dependency and a second templating syntax for six files without
choices. A write that fails part-way removes what it wrote.
"""

from __future__ import annotations

import argparse
import keyword
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

NAME = re.compile(r"[a-z][a-z0-9_]*")
USER_FOLDER = "user"
USER_PACKAGE_DOC = '''"""Your own models and data (``laptrain new NAME`` adds one package here).

The clone's root is on ``sys.path`` when ``python train.py`` runs, so a preset in ``conf/`` names
code here as ``_target_: user.<package>.<module>.<Class>`` (docs/your_model.md).
"""
'''


@dataclass(frozen=True)
class NewFile:
    """One file ``laptrain new`` writes: its path under the root and its text."""

    path: Path
    text: str


def class_name(name: str) -> str:
    """``my_task`` -> ``MyTask``: the prefix of the generated classes."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part)


def check_name(name: str) -> None:
    """Refuses a NAME that cannot be a preset and a Python package (ValueError, one line)."""
    if not NAME.fullmatch(name) or keyword.iskeyword(name) or not class_name(name):
        raise ValueError(
            f"NAME {name!r} must be a lowercase Python identifier (letters, digits, _; a letter "
            "first), e.g. laptrain new my_task"
        )


def _template(file: str) -> str:
    return (resources.files("laptrain") / "templates" / "new" / file).read_text(encoding="utf-8")


def _render(text: str, name: str) -> str:
    return text.replace("{{name}}", name).replace("{{cls}}", class_name(name))


def planned_files(name: str, root: Path, rewards: bool = False) -> list[NewFile]:
    """What ``laptrain new NAME [--rewards]`` writes under ``root``, rendered (nothing written)."""
    check_name(name)
    package = Path(USER_FOLDER) / name
    layout = {
        package / "__init__.py": "package_init.py.tmpl",
        package / "model.py": "model.py.tmpl",
        package / "data.py": "data.py.tmpl",
        package / f"test_{name}.py": "test.py.tmpl",
        Path("conf") / "model" / f"{name}.yaml": "model.yaml.tmpl",
        Path("conf") / "data" / f"{name}.yaml": "data.yaml.tmpl",
    } | ({package / "rewards.py": "rewards.py.tmpl"} if rewards else {})
    files = [NewFile(path, _render(_template(tmpl), name)) for path, tmpl in layout.items()]
    if not (root / USER_FOLDER / "__init__.py").is_file():
        files.insert(0, NewFile(Path(USER_FOLDER) / "__init__.py", USER_PACKAGE_DOC))
    return files


def write_new(name: str, root: Path, rewards: bool = False) -> list[Path]:
    """Writes the files of :func:`planned_files` under ``root``; returns their paths. ValueError
    (one line, nothing written) when ``root`` is no clone or a file exists."""
    if not (root / "conf" / "train.yaml").is_file():
        raise ValueError(
            f"{root} holds no conf/train.yaml: run laptrain new in a laptrain clone, or give "
            "--root <clone>"
        )
    files = planned_files(name, root, rewards)
    taken = [f.path for f in files if (root / f.path).exists()]
    if (root / USER_FOLDER / name).exists():
        taken.insert(0, Path(USER_FOLDER) / name)
    if taken:
        raise ValueError(
            f"{taken[0]} exists in {root}: laptrain new writes no file over another; choose "
            f"another NAME or remove it"
        )
    made: list[Path] = []
    try:
        for file in files:
            target = root / file.path
            for folder in reversed(target.parents):
                if folder.is_relative_to(root) and not folder.exists():
                    folder.mkdir()
                    made.append(folder)
            target.write_text(file.text, encoding="utf-8")
            made.append(target)
    except OSError:
        for path in reversed(made):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink()
        raise
    return [root / f.path for f in files]


def new_command(args: argparse.Namespace) -> int:
    from laptrain.project import project_root

    try:
        root = Path(args.root) if args.root else project_root()
        written = write_new(args.name, root.resolve(), args.rewards)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path.relative_to(root.resolve())}")
    print(
        f"train it: python train.py model={args.name} data={args.name}   "
        f"test it: python -m pytest {USER_FOLDER}/{args.name}"
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="a lowercase Python identifier, e.g. my_task")
    parser.add_argument(
        "--root",
        default=None,
        help="the laptrain clone to write into (default: this clone)",
    )
    parser.add_argument("--rewards", action="store_true", help="also GRPO rewards: rewards.py")
