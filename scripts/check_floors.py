"""Install laptrain with every dependency at the floor ``pyproject.toml`` declares, then run tests.

``python scripts/check_floors.py [pytest args...]`` builds ``.venv-floors/`` (torch 2.13.0 first,
as the README does), installs ``.[dev]`` constrained to ``name==floor`` for each ``name>=floor`` of
``[project] dependencies`` and the ``sweep`` extra, prints the versions it got, then runs
``python -m pytest -q`` (or the arguments given) in that environment. A floor that the code
outgrew fails here rather than on a user's machine.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-floors"


def floors() -> dict[str, str]:
    """``{distribution: floor}`` for each dependency with a ``>=`` bound (sweep extra included)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [*project["dependencies"], *project["optional-dependencies"]["sweep"]]
    found = {}
    for spec in specs:
        match = re.match(r"^([A-Za-z0-9_.\-]+)\s*[^;]*?>=\s*([0-9][^,;\s]*)", spec)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def main(argv: list[str]) -> int:
    pins = floors()
    pins.pop("torch", None)  # installed first, from the wheel on disk, exactly as the README does
    constraints = ROOT / ".venv-floors.constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()))
    python = VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)
    subprocess.run([*pip, "-c", str(constraints), "-e", f"{ROOT}[dev]"], check=True)
    names = ["torch", *pins]
    shown = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True
    ).stdout.splitlines()
    wanted = {n.lower().replace("_", "-") for n in names}
    for line in shown:
        if line.split("==")[0].lower().replace("_", "-") in wanted:
            print(line)
    return subprocess.run([str(python), "-m", "pytest", "-q", *argv], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
