"""Print one of the README's two commands, as written there, for .ci/run to execute.

``python3 .ci/readme_commands.py setup`` prints the first shell block under "## Two commands"
(set up and run the default job); ``... test`` the second (run the tests). Standard library only:
it runs before the project's environment exists. tests/test_readme.py checks that .ci/run runs
nothing else, so the README and CI cannot drift apart.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
NAMES = ("setup", "test")


def two_commands(text: str) -> dict[str, str]:
    """``{"setup": ..., "test": ...}``: the shell blocks of the README's "## Two commands"."""
    section = re.search(r"^## Two commands\n(.*?)(?=^## )", text, re.DOTALL | re.MULTILINE)
    if section is None:
        raise SystemExit("README.md has no '## Two commands' section")
    blocks = re.findall(r"^```bash\n(.*?)^```", section.group(1), re.DOTALL | re.MULTILINE)
    if len(blocks) != len(NAMES):
        raise SystemExit(f"README.md's '## Two commands' has {len(blocks)} bash blocks, not 2")
    return dict(zip(NAMES, (b.strip() for b in blocks), strict=True))


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in NAMES:
        raise SystemExit(f"usage: readme_commands.py {{{','.join(NAMES)}}}")
    print(two_commands(README.read_text())[sys.argv[1]])
