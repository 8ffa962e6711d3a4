"""Prompt rows for GRPO: read, checked and split without torch (``train.py``'s data check, before
the run folder exists) by the rules ``PromptDataModule`` applies.

A row is ``{prompt}`` (a string, or TRL's conversational list of messages) or ``{messages}`` (the
conversation so far, ending with a user turn), ``system`` optional, plus any other columns: those
reach the reward functions as keyword lists. Files are read by ``instruction_rows.read_rows``
(JSONL, JSON, CSV/TSV, Parquet) and split as instructions are. Bad rows (no prompt, an empty one,
a conversation ending with an assistant turn, a column a reward reads missing) are named by
``file:line`` in one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laptrain.data.file_formats import DataError
from laptrain.families.lora.instruction_rows import (
    INSTRUCTION_OPTIONS,
    Messages,
    check_instructions,
    field_value,
    read_named_rows,
    rows_error,
    to_messages,
)

ROW_KEYS = ("prompt", "messages", "system")
PROMPT_OPTIONS = {**INSTRUCTION_OPTIONS, "rewards": (list, type(None))}


@dataclass(frozen=True)
class PromptRow:
    """The conversation to continue, the prompt as the rewards see it (the user's last turn) and
    the row's other columns."""

    messages: Messages
    text: str
    columns: dict[str, Any] = field(default_factory=dict)


def row_prompt(row: Any, system_prompt: str | None = None) -> PromptRow | str:
    """The row as a :class:`PromptRow`, or why it is a bad row."""
    if not isinstance(row, Mapping):
        return "not an object"
    key = "messages" if row.get("messages") not in (None, "") else "prompt"
    prompt, why = field_value(row, key)
    if why:
        return why
    if prompt is None:
        return "no prompt"
    messages = to_messages(prompt, row.get("system") or system_prompt)
    turns = [m for m in messages if m["role"] != "system"]
    if not turns or not any(m["content"] for m in turns):
        return "empty prompt"
    if turns[-1]["role"] == "assistant":
        return f"{key} end with an assistant turn: end with the user's"
    columns = {str(k): v for k, v in row.items() if k not in ROW_KEYS}
    return PromptRow(messages, turns[-1]["content"], columns)


def bad_prompt_rows(bad: list[tuple[str, str]], total: int) -> DataError:
    """:func:`rows_error` for prompt rows."""
    return rows_error(
        "prompt rows need a non-empty prompt (or messages ending with a user turn) that fits "
        "data.max_length - model.max_new_tokens, and the columns the rewards read",
        bad,
        total,
    )


def read_prompts(
    files: Mapping[str, Any] | None,
    system_prompt: str | None = None,
    group_column: str | None = None,
    encoding: str = "utf-8",
) -> dict[str, list[tuple[str, PromptRow, Any]]]:
    """Every file's rows as prompts, or one error naming the bad rows."""
    return read_named_rows(
        files, lambda raw: row_prompt(raw, system_prompt), bad_prompt_rows, group_column, encoding
    )


def rows_missing_columns(
    named: Mapping[str, Sequence[tuple[str, PromptRow, Any]]], rewards: Sequence[Any] | None
) -> list[tuple[str, str]]:
    """``(file:line, why)`` for each row without a column one of ``rewards`` (config entries)
    reads; the rewards are imported here (a path that does not import is one line)."""
    if not rewards:
        return []
    from laptrain.families.lora.grpo_rewards import load_rewards

    loaded = load_rewards(list(rewards))
    bad = []
    for rows in named.values():
        for where, row, _ in rows:
            for reward in loaded:
                absent = sorted(reward.columns - set(row.columns))
                if absent:
                    bad.append((where, f"no {absent[0]} column, which {reward.name} reads"))
                    break
    return bad


def check_prompts(
    files: Mapping[str, Any] | None, rewards: list[Any] | None = None, **options: Any
) -> Any:
    """The rows read and split as ``PromptDataModule`` will, and checked against the columns the
    rewards read (``train.py``'s data check)."""
    splits = check_instructions(files, **options, read=read_prompts)
    bad = rows_missing_columns(splits, rewards)
    if bad:
        raise bad_prompt_rows(bad, sum(len(rows) for rows in splits.values()))
    return splits
