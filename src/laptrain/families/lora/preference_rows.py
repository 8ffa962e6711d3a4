"""Preference rows (a prompt, a chosen and a rejected answer) read and checked, named by line.

Three row shapes, in JSONL, JSON, CSV or Parquet (read by ``instruction_rows.read_rows``, by suffix):

- ``{prompt, chosen, rejected}``: three strings (``system`` optional, as for instructions);
- ``{messages, chosen, rejected}``: the conversation so far (ending with a user turn) and two
  answer strings;
- ``{chosen: [messages], rejected: [messages]}``: two whole conversations that differ only in
  their last assistant turn (TRL's conversational form); the shared part is the prompt.

A bad row is named with its reason, and all of them are refused in one line (``DataError``):
no chosen or rejected answer, chosen equal to rejected, an empty prompt, conversations whose
prompts differ.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laptrain.data.file_formats import DataError
from laptrain.families.lora.instruction_rows import (
    ROLES,
    _too_long,
    check_instructions,
    parse_json,
    read_named_rows,
    to_messages,
)

Messages = list[dict[str, str]]
Preference = tuple[Messages, str, str]  # prompt messages, chosen answer, rejected answer


def _messages(value: Any, what: str) -> Messages | str:
    if isinstance(value, str):
        value, why = parse_json(value)
        if why is not None:
            return f"{what} not JSON"
    if not isinstance(value, list) or not all(isinstance(m, Mapping) for m in value):
        return f"{what} not a list of {{role, content}}"
    for m in value:
        if m.get("role") not in ROLES:
            return f"unknown role {m.get('role')!r}"
        if m.get("content") is None:
            return "message without content"
    return [{"role": str(m["role"]), "content": str(m["content"])} for m in value]


def _conversations(row: Mapping[str, Any], system: str | None) -> Preference | str:
    """The ``{chosen: [messages], rejected: [messages]}`` shape."""
    pair = []
    for key in ("chosen", "rejected"):
        messages = _messages(row[key], key)
        if isinstance(messages, str):
            return messages
        if not messages or messages[-1]["role"] != "assistant":
            return f"{key} does not end with an assistant turn"
        pair.append(messages)
    (*prompt, chosen), (*other, rejected) = pair
    if prompt != other:
        return "prompts differ between chosen and rejected (only the last assistant turn may)"
    return to_messages(prompt, system), chosen["content"], rejected["content"]


def row_preference(row: Any, system_prompt: str | None = None) -> Preference | str:
    """``(prompt messages, chosen, rejected)`` of one row, or why it is a bad row."""
    if not isinstance(row, Mapping):
        return row if isinstance(row, str) else "not an object"
    system = row.get("system") or system_prompt
    for key in ("chosen", "rejected"):
        if row.get(key) is None or row.get(key) == "":
            return f"no {key}"
    chosen_raw = row["chosen"]
    as_list = isinstance(chosen_raw, list) or (
        isinstance(chosen_raw, str) and chosen_raw.lstrip().startswith("[{")
    )
    if as_list and row.get("prompt") is None and row.get("messages") is None:
        found = _conversations(row, system)
    else:
        if row.get("messages") not in (None, ""):
            prompt = _messages(row["messages"], "messages")
            if isinstance(prompt, str):
                return prompt
            if prompt and prompt[-1]["role"] == "assistant":
                return "messages end with an assistant turn: the prompt must end with the user's"
            prompt = to_messages(prompt, system)
        elif row.get("prompt") is not None:
            prompt = to_messages(str(row["prompt"]), system)
        else:
            return "no prompt (or messages)"
        found = prompt, str(chosen_raw), str(row["rejected"])
    if isinstance(found, str):
        return found
    prompt, chosen, rejected = found
    chosen, rejected = chosen.strip(), rejected.strip()
    if not any(m["content"].strip() for m in prompt if m["role"] != "system"):
        return "empty prompt"
    if not chosen or not rejected:
        return "empty chosen" if not chosen else "empty rejected"
    if chosen == rejected:
        return "chosen equals rejected"
    too_long = _too_long([*prompt, {"role": "assistant", "content": max(chosen, rejected)}])
    return too_long or (prompt, chosen, rejected)


def bad_preference_rows(bad: list[tuple[str, str]], total: int) -> DataError:
    """One line: the first three bad rows as ``file:line (why)``, the count, and the fix."""
    named = ", ".join(f"{where} ({why})" for where, why in bad[:3])
    more = ", ..." if len(bad) > 3 else ""
    return DataError(
        "preference rows need prompt (or messages) + chosen + rejected, two different answers "
        f"that fit data.max_length: {named}{more} ({len(bad)} bad rows of {total}): fix or drop them"
    )


def read_preferences(
    files: Mapping[str, Any] | None,
    system_prompt: str | None = None,
    group_column: str | None = None,
    encoding: str = "utf-8",
) -> dict[str, list[tuple[str, Preference, Any]]]:
    """Every file's rows as preferences, or one error naming the bad rows."""
    return read_named_rows(
        files,
        lambda raw: row_preference(raw, system_prompt),
        bad_preference_rows,
        group_column,
        encoding,
    )


def check_preferences(files: Mapping[str, Any] | None, **options: Any) -> Any:
    """The rows read and split as ``PreferenceDataModule`` will (``train.py``'s data check)."""
    return check_instructions(files, **options, read=read_preferences)
