"""Apply a hardware profile's ``env:`` map before torch is imported.

torch reads PYTORCH_ENABLE_MPS_FALLBACK, the MPS watermark ratios and OMP/MKL thread counts once, at
import or at the first allocation (FACTS.md §1, §2, §6), so this module must not import torch.
A variable the user already exported wins over the profile.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field


@dataclass
class EnvReport:
    """What ``apply_env`` did: ``applied`` were set from the profile, ``kept`` were already exported."""

    applied: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)

    def lines(self) -> list[str]:
        out = [f"env {k}={v} (from profile)" for k, v in sorted(self.applied.items())]
        out += [
            f"env {k}={v} (exported by you, profile value ignored)"
            for k, v in sorted(self.kept.items())
        ]
        return out


def apply_env(
    profile_env: Mapping[str, object] | None,
    environ: MutableMapping[str, str] | None = None,
) -> EnvReport:
    """Set each profile variable that is not already set; return what was applied and what was kept."""
    environ = os.environ if environ is None else environ
    report = EnvReport()
    for key, value in (profile_env or {}).items():
        if value is None:
            continue
        if key in environ:
            report.kept[key] = environ[key]
        else:
            environ[key] = str(value)
            report.applied[key] = str(value)
    return report
