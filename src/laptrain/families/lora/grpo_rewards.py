"""Rewards for GRPO: plain functions with TRL's signature, named by import path.

A reward is ``reward(prompts: list[str], completions: list[str], **columns) -> list[float]``
(TRL's ``GRPOTrainer`` reward functions): ``prompts`` as the user wrote them, ``completions`` the
sampled replies, and every other column of the rows as a keyword list of the same length. A
keyword parameter without a default is a column the reward needs; the prompt data is checked for
it before training. ``model.rewards`` lists them by import path (``user.my_task.rewards.correct``),
or as ``{path: ..., <keyword>: <value>}`` to fix some keywords (the built-ins' options);
``model.reward_weights`` weighs them (1 each by default) and the weighted sum is the reward.
No torch here: ``train.py``'s data check imports the rewards before the run folder exists.
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

RewardFn = Callable[..., list[float]]
_QUOTES = "`'\" "


def _clean(text: str) -> str:
    """Whitespace, quotes and backticks around, and one final period, taken off."""
    text = text.strip().strip(_QUOTES)
    return text[:-1].strip(_QUOTES) if text.endswith(".") else text


def exact_match(
    prompts: list[str], completions: list[str], answer: list[str], **_: Any
) -> list[float]:
    """1.0 where the completion is the row's ``answer`` column, else 0.0; both compared after
    stripping whitespace, surrounding quotes/backticks and one final period (case kept)."""
    return [float(_clean(c) == _clean(str(a))) for c, a in zip(completions, answer, strict=True)]


def regex_format(
    prompts: list[str], completions: list[str], pattern: str = r"^\S.*$", **_: Any
) -> list[float]:
    """1.0 where the whole completion (stripped) matches ``pattern`` (``re.fullmatch``, DOTALL)."""
    compiled = re.compile(pattern, re.DOTALL)
    return [float(compiled.fullmatch(c.strip()) is not None) for c in completions]


def length_target(
    prompts: list[str], completions: list[str], target: int = 8, unit: str = "words", **_: Any
) -> list[float]:
    """1.0 at ``target`` words (``unit: chars``: characters), falling linearly to 0.0 at 0 and at
    twice the target."""
    sizes = [len(c.split()) if unit == "words" else len(c.strip()) for c in completions]
    return [max(0.0, 1.0 - abs(n - target) / target) for n in sizes]


def picks_answer(
    prompts: list[str],
    completions: list[str],
    answer: list[str],
    options: list[list[str]],
    **_: Any,
) -> list[float]:
    """1.0 where the first of the row's ``options`` that the completion names (a whole word; the
    longest name where two start at one place) is its ``answer``, else 0.0: the choice made,
    whatever words are around it."""
    out = []
    for completion, right, names in zip(completions, answer, options, strict=True):
        alternatives = "|".join(re.escape(str(n)) for n in sorted(names, key=len, reverse=True))
        found = re.search(rf"(?<!\w)({alternatives})(?!\w)", completion) if names else None
        out.append(float(found is not None and found.group(1) == str(right)))
    return out


def short_answer(
    prompts: list[str], completions: list[str], words: int = 1, zero_at: int = 12, **_: Any
) -> list[float]:
    """1.0 for a completion of 1 to ``words`` words, falling linearly to 0.0 at ``zero_at`` words;
    an empty completion scores 0.0 (silence is not an answer)."""
    out = []
    for completion in completions:
        n = len(completion.split())
        slope = max(zero_at - words, 1)
        out.append(0.0 if n == 0 else max(0.0, min(1.0, (zero_at - n) / slope)))
    return out


@dataclass(frozen=True)
class Reward:
    """One reward function, its name in the config, its weight and the columns it reads."""

    name: str
    fn: RewardFn
    weight: float
    columns: frozenset[str]


def _import(path: str) -> RewardFn:
    module, _, name = path.rpartition(".")
    try:
        fn = getattr(importlib.import_module(module), name) if module else None
    except Exception as err:  # the user's file: any error while importing it is theirs
        raise ValueError(
            f"model.rewards: {path} does not import ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}): give a module.function path "
            "importable from the project folder"
        ) from None
    if not callable(fn):
        raise ValueError(
            f"model.rewards: {path} is not a function: give a module.function path such as "
            "laptrain.families.lora.grpo_rewards.exact_match"
        )
    return fn


def needed_columns(fn: RewardFn) -> frozenset[str]:
    """The keyword parameters of ``fn`` after ``prompts, completions`` without a default (nor
    fixed by a ``partial``): the columns it reads."""
    params = list(inspect.signature(fn).parameters.values())[2:]
    return frozenset(
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty
    )


def load_rewards(entries: Sequence[Any], weights: Sequence[float] | None = None) -> list[Reward]:
    """``model.rewards`` (paths, or ``{path, **keywords}``) imported, with their weights."""
    if not entries:
        raise ValueError(
            "model.rewards is empty: name at least one reward function, e.g. "
            "model.rewards=[laptrain.families.lora.grpo_rewards.exact_match]"
        )
    if weights is not None and len(weights) != len(entries):
        raise ValueError(
            f"model.reward_weights has {len(weights)} weights for {len(entries)} model.rewards: "
            "give one weight per reward (or null: 1 each)"
        )
    rewards = []
    for i, entry in enumerate(entries):
        if isinstance(entry, Mapping):
            options = {str(k): v for k, v in entry.items() if k != "path"}
            path = str(entry.get("path", ""))
            fn: RewardFn = partial(_import(path), **options)
        else:
            path = str(entry)
            fn = _import(path)
        weight = 1.0 if weights is None else float(weights[i])
        rewards.append(Reward(path.rpartition(".")[2], fn, weight, needed_columns(fn)))
    return rewards


def missing_columns(rewards: Sequence[Reward], columns: set[str]) -> list[tuple[str, str]]:
    """``(reward, column)`` for each column a reward reads that the rows do not have."""
    return [(r.name, c) for r in rewards for c in sorted(r.columns - columns)]


def score(
    rewards: Sequence[Reward],
    prompts: list[str],
    completions: list[str],
    columns: Mapping[str, list[Any]],
) -> list[list[float]]:
    """``[N][len(rewards)]`` scores; a reward that raises, returns another length or a
    value that is not a finite number stops the run in one line naming it and the prompt."""
    out = [[0.0] * len(rewards) for _ in completions]
    for j, reward in enumerate(rewards):
        try:
            values = list(reward.fn(prompts, completions, **columns))
        except Exception as err:
            raise ValueError(
                f"reward {reward.name} raised {type(err).__name__}: "
                f"{str(err).splitlines()[0] if str(err) else ''} (prompt {prompts[0]!r:.80}): "
                "fix the function"
            ) from None
        if len(values) != len(completions):
            raise ValueError(
                f"reward {reward.name} returned {len(values)} values for {len(completions)} "
                f"completions (prompt {prompts[0]!r:.80}): return one float per completion"
            )
        for i, value in enumerate(values):
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(
                    f"reward {reward.name} returned {value!r} (prompt {prompts[i]!r:.80}): "
                    "return a finite float per completion"
                )
            out[i][j] = float(value)
    return out
