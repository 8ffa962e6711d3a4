"""GRPO rewards: the built-ins, loading by import path with weights, the columns a reward reads,
and a reward that misbehaves stopping the run in one line."""

from __future__ import annotations

import sys

import pytest

from laptrain.families.lora.grpo_rewards import (
    exact_match,
    length_target,
    load_rewards,
    missing_columns,
    picks_answer,
    regex_format,
    score,
    short_answer,
)

BUILTIN = "laptrain.families.lora.grpo_rewards"


def test_exact_match_strips_whitespace_quotes_and_one_final_period():
    got = exact_match(["p"] * 4, [" `dumps`.\n", "dumps", "Dumps", "dumps()"], answer=["dumps"] * 4)
    assert got == [1.0, 1.0, 0.0, 0.0]


def test_regex_format_matches_the_whole_stripped_completion():
    assert regex_format(["p"] * 3, ["ok.", " two words ", "a\nb"], pattern=r"\w+ \w+") == [
        0.0,
        1.0,
        0.0,
    ]


def test_length_target_peaks_at_the_target():
    assert length_target(["p"] * 3, ["a b", "a b c d", "a b c d e f g h"], target=4) == [
        0.5,
        1.0,
        0.0,
    ]


def test_picks_answer_reads_the_first_option_named_as_a_whole_word():
    options = [["IMAP4", "IMAP4_stream", "ParseFlags"]] * 5
    completions = [
        "The `imaplib` function is `IMAP4_stream`.",  # the longer name, not IMAP4 inside it
        "IMAP4",
        "ParseFlags, or maybe IMAP4",  # the first named is the choice
        "imap4",  # case counts, as in the names
        "None of them",
    ]
    assert picks_answer(["p"] * 5, completions, answer=["IMAP4"] * 5, options=options) == [
        0.0,
        1.0,
        0.0,
        0.0,
        0.0,
    ]


def test_short_answer_is_one_up_to_the_words_and_zero_for_silence():
    completions = ["", "dumps", "it is dumps", " ".join(["w"] * 12), " ".join(["w"] * 7)]
    got = short_answer(["p"] * 5, completions, words=1, zero_at=12)
    assert got[:4] == [0.0, 1.0, 9 / 11, 0.0]
    assert got[4] == pytest.approx(5 / 11)


def test_rewards_load_by_path_with_options_weights_and_columns():
    rewards = load_rewards(
        [f"{BUILTIN}.exact_match", {"path": f"{BUILTIN}.regex_format", "pattern": "x+"}],
        [2.0, 0.5],
    )
    assert [(r.name, r.weight, set(r.columns)) for r in rewards] == [
        ("exact_match", 2.0, {"answer"}),
        ("regex_format", 0.5, set()),
    ]
    assert missing_columns(rewards, {"module"}) == [("exact_match", "answer")]
    scores = score(rewards, ["q", "q"], ["xx", "a"], {"answer": ["a", "a"]})
    assert scores == [[0.0, 1.0], [1.0, 0.0]]


def test_a_reward_path_that_does_not_import_is_one_line():
    with pytest.raises(ValueError, match=r"model.rewards: nowhere.rewards.good does not import"):
        load_rewards(["nowhere.rewards.good"])
    with pytest.raises(ValueError, match="model.reward_weights has 1 weights for 2 model.rewards"):
        load_rewards([f"{BUILTIN}.exact_match", f"{BUILTIN}.length_target"], [1.0])


def test_a_users_reward_file_beside_the_project(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def shouts(prompts, completions, **kwargs):\n"
        "    return [float(c.isupper()) for c in completions]\n"
        "def broken(prompts, completions, **kwargs):\n"
        "    raise KeyError('answer')\n"
        "def short(prompts, completions, **kwargs):\n"
        "    return [1.0]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    shouts, broken, short = load_rewards(
        ["my_rewards.shouts", "my_rewards.broken", "my_rewards.short"]
    )
    assert score([shouts], ["q", "q"], ["HI", "hi"], {}) == [[1.0], [0.0]]
    with pytest.raises(
        ValueError, match=r"^reward broken raised KeyError: 'answer' \(prompt 'q'\)"
    ):
        score([broken], ["q", "q"], ["a", "b"], {})
    with pytest.raises(ValueError, match=r"^reward short returned 1 values for 2 completions"):
        score([short], ["q", "q"], ["a", "b"], {})
