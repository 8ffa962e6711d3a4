"""Preference rows (a prompt, a chosen and a rejected answer) read and checked, named by line.

Every preference shape TRL documents, and one of laptrain's own, in JSONL, JSON, CSV or Parquet
(read by ``instruction_rows.read_rows``, by suffix):

- ``{prompt, chosen, rejected}``: three strings (``system`` optional, as for instructions), or
  TRL's conversational explicit prompt: ``prompt`` a list of messages, ``chosen`` and
  ``rejected`` each one assistant message;
- ``{chosen, rejected}`` strings (TRL's implicit prompt): their shared beginning is the prompt;
- ``{chosen: [messages], rejected: [messages]}``: two whole conversations that differ only in
  their last assistant turn (TRL's conversational implicit prompt); the shared part is the prompt;
- ``{messages, chosen, rejected}``: the conversation so far (ending with a user turn) and two
  answer strings.

A bad row is named with its reason, and all of them are refused in one line (``DataError``):
no chosen or rejected answer, chosen equal to rejected, an empty prompt, conversations whose
prompts differ, a field that is neither a string nor a list of ``{role, content}`` messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laptrain.data.file_formats import DataError
from laptrain.families.lora.instruction_rows import (
    ROLES,
    _too_long,
    check_instructions,
    field_value,
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


def _conversations(pair: list[Messages], system: str | None) -> Preference | str:
    """The ``{chosen: [messages], rejected: [messages]}`` shape."""
    for key, messages in zip(("chosen", "rejected"), pair, strict=True):
        if not messages or messages[-1]["role"] != "assistant":
            return f"{key} does not end with an assistant turn"
    (*prompt, chosen), (*other, rejected) = pair
    if prompt != other:
        return "prompts differ between chosen and rejected (only the last assistant turn may)"
    return to_messages(prompt, system), chosen["content"], rejected["content"]


def _shared_prompt(chosen: str, rejected: str, system: str | None) -> Preference | str:
    """TRL's implicit prompt of two strings: their shared beginning (``extract_prompt`` in
    trl/data_utils.py: cut where they first differ, before a space there)."""
    cut = next((i for i, (a, b) in enumerate(zip(chosen, rejected)) if a != b), 0)
    if cut and chosen[cut - 1] == " ":
        cut -= 1
    if not chosen[:cut].strip():
        return "no prompt (or messages), and chosen and rejected share no beginning to take as one"
    return to_messages(chosen[:cut], system), chosen[cut:], rejected[cut:]


def _answer(value: str | Messages, key: str) -> str:
    """An answer string, or (a list) the content of its one assistant message; else why not."""
    if isinstance(value, str):
        return value
    if len(value) != 1 or value[0]["role"] != "assistant":
        raise ValueError(f"{key} is a list but not one assistant message")
    return value[0]["content"]


def row_preference(row: Any, system_prompt: str | None = None) -> Preference | str:
    """``(prompt messages, chosen, rejected)`` of one row, or why it is a bad row."""
    if not isinstance(row, Mapping):
        return row if isinstance(row, str) else "not an object"
    system = row.get("system") or system_prompt
    values = {}
    for key in ("prompt", "chosen", "rejected"):
        values[key], why = field_value(row, key)
        if why is not None:
            return why
    prompt_value, chosen_raw, rejected_raw = values.values()
    for key in ("chosen", "rejected"):
        if values[key] is None or values[key] == "":
            return f"no {key}"
    has_messages = row.get("messages") not in (None, "")
    if prompt_value is None and not has_messages:
        if isinstance(chosen_raw, list) and isinstance(rejected_raw, list):
            found = _conversations([chosen_raw, rejected_raw], system)
        elif isinstance(chosen_raw, str) and isinstance(rejected_raw, str):
            found = _shared_prompt(chosen_raw, rejected_raw, system)
        else:
            return "chosen and rejected: both strings or both conversations"
    else:
        if has_messages:
            prompt = _messages(row["messages"], "messages")
            if isinstance(prompt, str):
                return prompt
            prompt = to_messages(prompt, system)
        else:
            prompt = to_messages(prompt_value, system)
        if prompt and prompt[-1]["role"] == "assistant":
            return "prompt ends with an assistant turn: it must end with the user's"
        try:
            found = prompt, _answer(chosen_raw, "chosen"), _answer(rejected_raw, "rejected")
        except ValueError as err:
            return str(err)
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
