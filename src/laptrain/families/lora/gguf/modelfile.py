"""An Ollama ``Modelfile`` for an exported GGUF: ``FROM``, the chat template in Ollama's template
language, and the stop tokens.

Gap it fills: a GGUF carries its chat template as Jinja, which llama.cpp and LM Studio read, but
Ollama formats prompts with a Go template given in the Modelfile. No package translates one into
the other. Here the Jinja template is *rendered* (transformers' ``apply_chat_template``) for probe
conversations, and the text around each probe message becomes the Go template's fixed parts:

- the opening when a system message is given, and when none is (a template may insert a default
  system prompt there, as SmolLM2's does);
- each role's text before and after its content, for user and assistant turns;
- the generation prompt (the assistant turn's opening).

The result is checked against the Jinja template before it is written: rendering the probes back
through the parts must give the same text, for conversations with and without a system message.
A template whose turns depend on their neighbours (the text of one turn changes once a later turn
is added) cannot be written this way and is refused in one line. Ollama's template variables
(``.System``, ``.Messages``, ``.Role``, ``.Content``) are documented in its ``docs/template.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_MARK = "@@laptrain-probe-{}@@"  # no whitespace at its ends: templates may trim content
SYSTEM, USER, ASSISTANT, USER2 = (_MARK.format(i) for i in range(4))


@dataclass(frozen=True)
class ChatParts:
    with_system: tuple[str, str]  # text before and after the system message
    without_system: str  # the opening when there is no system message
    user: tuple[str, str]
    assistant: tuple[str, str]
    generation: str  # the assistant turn's opening, written after the last message


def _render(tokenizer: Any, messages: list[dict[str, str]], generation: bool) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)


def _split(text: str, mark: str) -> tuple[str, str]:
    if text.count(mark) != 1:
        raise ValueError(_refusal("it does not write each message's content exactly once"))
    before, after = text.split(mark)
    return before, after


def _refusal(why: str) -> str:
    return (
        f"the chat template cannot be written as an Ollama template ({why}): the GGUF keeps the "
        "template itself; write the Modelfile's TEMPLATE by hand (Ollama docs/template.md)"
    )


def _after(text: str, head: str) -> str:
    if not text.startswith(head):
        raise ValueError(_refusal("a turn's text changes once a later turn is added"))
    return text[len(head) :]


def chat_parts(tokenizer: Any) -> ChatParts:
    """The fixed parts of ``tokenizer``'s chat template, checked to reproduce it."""
    system = {"role": "system", "content": SYSTEM}
    user = {"role": "user", "content": USER}
    assistant = {"role": "assistant", "content": ASSISTANT}
    user2 = {"role": "user", "content": USER2}
    one = _render(tokenizer, [system], False)
    sys_before, sys_after = _split(one, SYSTEM)
    two = _render(tokenizer, [system, user], False)
    user_before, user_after = _split(_after(two, one), USER)
    three = _render(tokenizer, [system, user, assistant], False)
    asst_before, asst_after = _split(_after(three, two), ASSISTANT)
    generation = _after(_render(tokenizer, [system, user], True), two)
    bare = _render(tokenizer, [user], False)
    opening, _ = _split(bare, user_before + USER)
    parts = ChatParts(
        with_system=(sys_before, sys_after),
        without_system=opening,
        user=(user_before, user_after.replace(USER, "")),
        assistant=(asst_before, asst_after),
        generation=generation,
    )
    for messages in ([system, user, assistant, user2], [user, assistant, user2]):
        if render_parts(parts, messages) != _render(tokenizer, messages, True):
            raise ValueError(_refusal("a four-turn conversation renders differently"))
    return parts


def render_parts(parts: ChatParts, messages: list[dict[str, str]]) -> str:
    """What the Go template written by :func:`modelfile` gives for ``messages`` (with the
    generation prompt): the reference the checks compare with the Jinja template's text."""
    text = ""
    rest = messages
    if messages and messages[0]["role"] == "system":
        text += parts.with_system[0] + messages[0]["content"] + parts.with_system[1]
        rest = messages[1:]
    else:
        text += parts.without_system
    for message in rest:
        before, after = parts.user if message["role"] == "user" else parts.assistant
        text += before + message["content"] + after
    return text + parts.generation


def _go(text: str) -> str:
    """Fixed text inside a Go template: ``{{`` would open an action, so it is written as one."""
    if '"""' in text:
        raise ValueError(_refusal('its text holds """, which ends a Modelfile block'))
    return text.replace("{{", '{{ "{{" }}')


def go_template(parts: ChatParts) -> str:
    """The parts as an Ollama (Go) template over ``.System`` and ``.Messages``."""
    return (
        f"{{{{ if .System }}}}{_go(parts.with_system[0])}{{{{ .System }}}}"
        f"{_go(parts.with_system[1])}{{{{ else }}}}{_go(parts.without_system)}{{{{ end }}}}"
        "{{ range .Messages }}"
        f'{{{{ if eq .Role "user" }}}}{_go(parts.user[0])}{{{{ .Content }}}}{_go(parts.user[1])}'
        f'{{{{ else if eq .Role "assistant" }}}}{_go(parts.assistant[0])}{{{{ .Content }}}}'
        f"{_go(parts.assistant[1])}{{{{ end }}}}"
        "{{ end }}"
        f"{_go(parts.generation)}"
    )


def modelfile(gguf_name: str, tokenizer: Any, stops: list[str]) -> str:
    """The Modelfile text: ``FROM ./<gguf_name>``, ``TEMPLATE`` and one ``PARAMETER stop`` per
    end-of-turn token."""
    lines = [f"FROM ./{gguf_name}"]
    if tokenizer.chat_template:
        lines.append(f'TEMPLATE """{go_template(chat_parts(tokenizer))}"""')
    for stop in dict.fromkeys(s for s in stops if s):
        lines.append(f"PARAMETER stop {stop_value(stop)}")
    return "\n".join(lines) + "\n"


def stop_value(stop: str) -> str:
    """``stop`` quoted so that Ollama reads it back whole: in double quotes, else in triple ones
    (its parser has no escapes; see :func:`read_value`); one line when neither form can hold it."""
    for written in (f'"{stop}"', f'"""{stop}"""'):
        if read_value(written) == (stop, ""):
            return written
    raise ValueError(
        f"the end-of-turn token {stop!r} cannot be written as an Ollama PARAMETER stop (a quote "
        "before a line break, or a control character): the GGUF keeps it; write the Modelfile's "
        "stop by hand"
    )


def read_value(written: str) -> tuple[str, str] | None:
    """``(value, rest)`` as Ollama reads a command's value from ``written`` (ParseFile in
    ollama's parser/parser.go): the value runs to the first line break where the text so far,
    trimmed, is bare or whole in double or triple quotes (quotes only stripped, no escapes),
    spaces and tabs kept, other unprintable characters dropped; None when it never ends."""
    text = ""
    for i, char in enumerate(written + "\n"):
        if char in "\r\n":
            value = _unquote(text.strip())
            if value is not None:
                return value, written[i + 1 :]
            text += char
        elif char in " \t" or char.isprintable():
            text += char
    return None


def _unquote(text: str) -> str | None:
    if text.startswith('"""'):
        return text[3:-3] if len(text) >= 6 and text.endswith('"""') else None
    if text.startswith('"'):
        return text[1:-1] if len(text) >= 2 and text.endswith('"') else None
    return text
