"""Offline instruction pairs from the standard library's sources, split by module."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from hydra.utils import instantiate

from laptrain.families.lora import stdlib_instructions
from laptrain.families.lora.chat_tokenizer import build_offline_tokenizer
from laptrain.families.lora.stdlib_instructions import build_stdlib_instructions, first_sentence
from tests.conftest import compose_train

MODULES = ["textwrap", "shlex", "heapq", "bisect", "fnmatch", "glob", "getopt", "string", "json"]


def test_first_sentence_of_the_first_paragraph():
    doc = "Return the sum.\n\n    Longer text. More."
    assert first_sentence(doc) == "Return the sum."
    assert first_sentence("Split  the\n  string? Then more.") == "Split the string?"
    assert first_sentence("No full stop") == "No full stop"


def test_pairs_name_module_and_function_are_cached_and_nothing_is_imported(tmp_path, monkeypatch):
    assert "this" not in sys.modules  # importing it prints the Zen of Python
    files = build_stdlib_instructions(str(tmp_path), ["textwrap", "this"])
    assert "this" not in sys.modules
    rows = [json.loads(line) for line in Path(files["all"]).read_text().splitlines()]
    pairs = {r["prompt"]: r["response"] for r in rows}
    assert pairs["What does `textwrap.dedent` do?"].startswith("Remove any common leading")
    assert all(re.fullmatch(r"What does `textwrap\.\w+` do\?", p) for p in pairs)
    assert {r["module"] for r in rows} == {"textwrap"}

    def boom(*a, **k):
        raise AssertionError("parsed again")

    monkeypatch.setattr(stdlib_instructions, "collect_pairs", boom)
    assert build_stdlib_instructions(str(tmp_path), ["textwrap", "this"]) == files
    with pytest.raises(AssertionError, match="parsed again"):
        build_stdlib_instructions(str(tmp_path), ["textwrap"])


def test_the_yaml_builds_a_module_split_no_module_in_two_splits(tmp_path):
    texts = [r["response"] for r in stdlib_instructions.collect_pairs(MODULES)]
    build_offline_tokenizer(texts, 400).save_pretrained(tmp_path / "tok")
    cfg = compose_train(
        [
            "data=stdlib_instructions",
            "hardware=cpu",
            f"data.tokenizer={tmp_path / 'tok'}",
            f"data.builder.modules=[{','.join(MODULES)}]",
            "data.batch_size=4",
        ],
        tmp_path,
    )
    dm = instantiate(cfg.data, _convert_="all")
    dm.setup()
    modules = {}
    for split in ("train", "val", "test"):
        prompts = [dm.tokenizer.decode(ids) for ids in dm.splits[split]["input_ids"]]
        names = [re.search(r"What does `([\w.]+)` do\?", p).group(1) for p in prompts]
        modules[split] = {n.rsplit(".", 1)[0] for n in names}
    assert modules["val"] and modules["test"]
    assert modules["train"].isdisjoint(modules["val"] | modules["test"])
    assert modules["val"].isdisjoint(modules["test"])
    batch = next(iter(dm.train_dataloader()))
    assert int(batch["num_response_tokens"]) > 0
