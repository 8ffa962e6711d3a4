"""pyproject.toml declares every package src/ imports, and the installed versions meet its floors."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata

from tests.conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10, which pyproject.toml supports: the dev extra installs tomli there
    import tomli as tomllib

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Imports whose distribution is only installed on some machines (not findable in this environment).
NOT_INSTALLED_HERE = {
    "Foundation": "pyobjc-framework-Cocoa",
    "bitsandbytes": "bitsandbytes",
    "llama_cpp": "llama-cpp-python",  # the llamacpp extra: built from source, not in .[dev]
    "lm_eval": "lm-eval",  # the eval extra: heavy (scipy, scikit-learn, nltk), not in .[dev]
}


def _name(spec: str) -> str:
    return re.split(r"[\s<>=!;\[~]", spec, maxsplit=1)[0].lower().replace("_", "-")


def declared() -> set[str]:
    """Distribution names in dependencies and every extra (self-references left out)."""
    specs = list(PROJECT["dependencies"])
    for extra in PROJECT["optional-dependencies"].values():
        specs += extra
    return {_name(s) for s in specs} - {"laptrain"}


def imported_modules() -> set[str]:
    """Top-level modules imported anywhere under src/ (static and in-function imports alike)."""
    found = set()
    for path in (ROOT / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    for path in (ROOT / "src").rglob("*.py"):  # importlib.util.find_spec("x") checks count too
        found |= set(re.findall(r'find_spec\("([A-Za-z_]+)', path.read_text()))
    return found - set(sys.stdlib_module_names) - {"laptrain", "hydra_plugins"}


def test_every_imported_package_is_declared():
    owners = metadata.packages_distributions()
    missing = {}
    for module in imported_modules():
        names = owners.get(module) or [NOT_INSTALLED_HERE.get(module, module)]
        if not {_name(n) for n in names} & declared():
            missing[module] = names
    assert not missing, f"imported by src/ but not declared in pyproject.toml: {missing}"


def test_installed_versions_meet_the_floors():
    from packaging.version import Version

    for spec in PROJECT["dependencies"]:
        floor = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        if floor:
            installed = Version(metadata.version(_name(spec)))
            assert installed >= Version(floor.group(1)), spec


def test_the_suite_reads_toml_on_python_3_10_too():
    """tomllib is Python 3.11's; requires-python says 3.10, where the dev extra brings tomli."""
    assert PROJECT["requires-python"] == ">=3.10"
    assert "tomli>=2; python_version < '3.11'" in PROJECT["optional-dependencies"]["dev"]
    bare = [
        path.name
        for path in (ROOT / "tests").glob("*.py")
        if "import tomllib" in path.read_text()
        and "import tomli as tomllib" not in path.read_text()
    ]
    assert bare == []
