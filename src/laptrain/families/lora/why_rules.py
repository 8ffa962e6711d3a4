"""The LoRA family's own rule of ``laptrain why`` (``FAMILY.why``): DPO's likelihood fall."""

from __future__ import annotations

from laptrain.commands.why import Finding, Series, finite_points, number_text, smoothed

DPO_FALL = 0.10
DPO_POINTS = 4


def dpo_likelihood_fall(series: Series) -> list[Finding]:
    """The chosen answers' log-probability (``train/logps_chosen``, smoothed) ending ``DPO_FALL``
    or more below where it started while the rejected ones' fell too: the reward margin grows by
    pushing both answers down, the failure DPO is known for; needs ``DPO_POINTS`` points."""
    chosen = finite_points(series.get("train/logps_chosen", []))
    rejected = finite_points(series.get("train/logps_rejected", []))
    if len(chosen) < DPO_POINTS or len(rejected) < DPO_POINTS:
        return []
    c, r = smoothed([v for _, v in chosen]), smoothed([v for _, v in rejected])
    if c[0] - c[-1] < DPO_FALL * abs(c[0]) or r[-1] >= r[0]:
        return []
    return [
        Finding(
            "dpo",
            chosen[-1][0],
            c[-1],
            f"DPO: the chosen answers' log-probability fell {number_text(c[0])} -> "
            f"{number_text(c[-1])} (smoothed, steps {chosen[0][0]}-{chosen[-1][0]}) along with the "
            f"rejected ones' ({number_text(r[0])} -> {number_text(r[-1])}): the margin grows by "
            "pushing both answers down",
            "raise model.beta (e.g. 0.1 -> 0.3) to stay nearer the base, lower model.optimizer.lr, "
            "or start from an instruction-tuned run (model.init_adapters=<run>)",
        )
    ]
