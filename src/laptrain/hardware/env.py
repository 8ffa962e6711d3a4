"""Apply a hardware profile's ``env:`` map before torch is imported (torch reads these at import or
when the MPS allocator starts: docs/hardware.md §1, §2, §6); a variable the user exported wins.
The MPS allocator refuses LOW > HIGH watermarks with a bare RuntimeError at the first allocation
(``init_allocator``, aten/src/ATen/mps/MPSAllocator.mm): ``resolve_watermarks`` checks it here,
for the launcher and ``laptrain doctor``."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field

from laptrain.hardware.profile import ProfileError

HIGH, LOW = "PYTORCH_MPS_HIGH_WATERMARK_RATIO", "PYTORCH_MPS_LOW_WATERMARK_RATIO"
# torch's defaults on unified memory (Apple Silicon), and the upper bound for both ratios there
# (MPSAllocator.h default_high_watermark_ratio / default_low_watermark_ratio_unified; .mm upper bound).
DEFAULT_HIGH, DEFAULT_LOW, RATIO_MAX = 1.7, 1.4, 2.0
# A LOW the launcher must lower goes to this fraction of HIGH: the profiles' 0.7 / 0.8, so the
# allocator still starts collecting its cache a little before the hard cap.
LOW_OF_HIGH = 0.875


class WatermarkError(ProfileError):
    """Exported watermark ratios torch's MPS allocator would refuse; the message names the fix."""


@dataclass(frozen=True)
class Watermarks:
    """The MPS watermark ratios torch will use: ``set_low``, the LOW the launcher exports so that
    LOW <= HIGH (None: none); ``notes``, one line each; ``problem`` / ``fix``, what only the user
    can repair."""

    high: float
    low: float
    set_low: str | None = None
    notes: tuple[str, ...] = ()
    problem: str = ""
    fix: str = ""

    @property
    def ok(self) -> bool:
        return not self.problem

    def message(self) -> str:
        """The one-line refusal: what is wrong, then the fix."""
        return f"{self.problem}; {self.fix}"


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _fmt(value: float) -> str:
    return f"{value:.4g}"


# how a message names where a ratio came from
ORIGIN = {"you": "your", "profile": "the profile's", "default": "torch's default"}


def _ratios(
    profile: Mapping[str, str], exported: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, float]]:
    """Where HIGH and LOW come from ("you", "profile", "default") and their values (NaN: not a number)."""
    sources, values = {}, {}
    for key, default in ((HIGH, DEFAULT_HIGH), (LOW, DEFAULT_LOW)):
        if key in exported:
            sources[key], values[key] = "you", _number(exported[key])
        elif key in profile:
            sources[key], values[key] = "profile", _number(profile[key])
        else:
            sources[key], values[key] = "default", default
    return sources, values


def _out_of_range(
    sources: Mapping[str, str],
    values: Mapping[str, float],
    profile: Mapping[str, str],
    exported: Mapping[str, str],
) -> Watermarks | None:
    """The refusal for the first ratio that is not a number in [0, RATIO_MAX]; None when both are."""
    for key in (HIGH, LOW):
        if math.isnan(values[key]) or not 0.0 <= values[key] <= RATIO_MAX:
            raw = exported.get(key, profile.get(key))
            return Watermarks(
                values[HIGH],
                values[LOW],
                problem=f"{ORIGIN[sources[key]]} {key}={raw} is not a number between 0 and "
                f"{_fmt(RATIO_MAX)} (torch's MPS allocator refuses others and reads text as 0.0, "
                "no cap)",
                fix=f"set it to e.g. 0.8 (HIGH) / 0.7 (LOW), or unset {key}",
            )
    return None


def resolve_watermarks(
    profile_env: Mapping[str, object] | None, exported: Mapping[str, str]
) -> Watermarks:
    """Check the MPS watermark ratios torch will see: the user's exports, else the profile's, else
    torch's defaults. LOW that did not come from the user is lowered to ``LOW_OF_HIGH`` x HIGH when
    it exceeds HIGH; a bad combination the user exported is a ``problem``."""
    profile = {k: str(v) for k, v in (profile_env or {}).items() if v is not None}
    sources, values = _ratios(profile, exported)
    high, low = values[HIGH], values[LOW]
    bad = _out_of_range(sources, values, profile, exported)
    if bad is not None:
        return bad
    notes = []
    if sources[HIGH] == "you" and high == 0.0:
        notes.append(
            f"warning: you exported {HIGH}=0.0: no cap on MPS memory, so a job too large for this "
            "Mac swaps instead of stopping with an out-of-memory error (unset it to keep the "
            "profile's cap)"
        )
    limit = RATIO_MAX if high == 0.0 else high  # HIGH 0.0 = no cap: LOW may go up to the bound
    if low <= limit:
        return Watermarks(high, low, notes=tuple(notes))
    if sources[LOW] == "you":
        return Watermarks(
            high,
            low,
            notes=tuple(notes),
            problem=f"you exported {LOW}={_fmt(low)}, above {ORIGIN[sources[HIGH]]} "
            f"{HIGH}={_fmt(high)}: torch's MPS allocator refuses LOW > HIGH at its first allocation",
            fix=f"export {LOW} <= {HIGH} (e.g. 0.7 and 0.8), or unset {LOW}",
        )
    new = _fmt(high * LOW_OF_HIGH)
    notes.append(
        f"env {LOW}={new}: lowered from {ORIGIN[sources[LOW]]} {_fmt(low)} to {LOW_OF_HIGH} x "
        f"{ORIGIN[sources[HIGH]]} {HIGH}={_fmt(high)}, because torch's MPS allocator refuses LOW > HIGH"
    )
    return Watermarks(high, float(new), set_low=new, notes=tuple(notes))


@dataclass
class EnvReport:
    """What ``apply_env`` did: ``applied`` were set from the profile, ``kept`` were already exported,
    ``notes`` are one-line warnings to print once (e.g. a lowered MPS watermark)."""

    applied: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    lowered: set[str] = field(default_factory=set)

    def lines(self) -> list[str]:
        out = [
            f"env {k}={v} ({'lowered to stay <= HIGH' if k in self.lowered else 'from profile'})"
            for k, v in sorted(self.applied.items())
        ]
        out += [
            f"env {k}={v} (exported by you, profile value ignored)"
            for k, v in sorted(self.kept.items())
        ]
        return out


def apply_env(
    profile_env: Mapping[str, object] | None,
    environ: MutableMapping[str, str] | None = None,
) -> EnvReport:
    """Set each profile variable not already set; return what was applied and what was kept. Raises
    ``WatermarkError`` before setting anything for exported MPS watermarks torch would refuse."""
    environ = os.environ if environ is None else environ
    marks = resolve_watermarks(profile_env, environ)
    if not marks.ok:
        raise WatermarkError(marks.message())
    report = EnvReport(notes=list(marks.notes))
    for key, value in (profile_env or {}).items():
        if value is None:
            continue
        if key in environ:
            report.kept[key] = environ[key]
        else:
            environ[key] = str(value)
            report.applied[key] = str(value)
    if marks.set_low is not None:
        environ[LOW] = marks.set_low
        report.applied[LOW] = marks.set_low
        report.lowered.add(LOW)
    return report
