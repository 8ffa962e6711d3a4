"""Instruction data: response-only labels, truncation, bad rows, padding shapes, packing, resume."""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path

import pytest
import torch

from laptrain.families.lora import instructions
from laptrain.families.lora.chat_tokenizer import build_offline_tokenizer
from laptrain.families.lora.instruction_rows import PlainText, row_messages
from laptrain.families.lora.instructions import (
    CausalLMCollator,
    InstructionDataModule,
    encode_chat,
    render_prompt,
)
from tests.conftest import TINY_LORA
from tests.in_process import train_here

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "theta",
    "kappa",
    "lambda",
    "sigma",
    "omega",
]
EOT = "<|eot_id|>"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    texts = [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(12)) for i in range(40)]
    folder = tmp_path_factory.mktemp("tok")
    build_offline_tokenizer(texts + ["What is the answer? It is 42."], 400).save_pretrained(folder)
    return str(folder)


def qa_rows(n: int, seed: int = 0) -> list[dict]:
    rows = []
    for i in range(n):
        k = (i * 7 + seed) % 23
        prompt = f"Question {i}: " + " ".join(WORDS[(i + j) % 11] for j in range(1 + k))
        rows.append(
            {"prompt": prompt, "response": " ".join(WORDS[(i + j) % 11] for j in range(3 + i % 5))}
        )
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def module(
    tmp_path: Path, tokenizer_dir: str, rows: list | None = None, **kw
) -> InstructionDataModule:
    if "files" not in kw:
        kw["files"] = {"train": str(write_jsonl(tmp_path / "d.jsonl", rows or qa_rows(80)))}
    kw.setdefault("max_length", 64)
    kw.setdefault("batch_size", 4)
    return InstructionDataModule(tokenizer=tokenizer_dir, cache_dir=str(tmp_path / "c"), **kw)


def response_text(tok, ids, labels) -> str:
    return tok.decode([t for t, label in zip(ids, labels, strict=True) if label != -100])


def test_only_responses_are_labelled_and_generation_prompt_equals_training_prefix(
    tmp_path, tokenizer_dir
):
    rows = qa_rows(30)
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "alpha?"},
        {"role": "assistant", "content": "beta gamma"},
        {"role": "user", "content": "delta?"},
        {"role": "assistant", "content": "epsilon"},
    ]
    dm = module(tmp_path, tokenizer_dir, [*rows, {"messages": chat}], max_length=512)
    dm.setup()
    tok = dm.tokenizer
    expected = sorted([r["response"] + EOT for r in rows] + ["beta gamma" + EOT + "epsilon" + EOT])
    got = []
    for split in ("train", "val", "test"):
        for ex in dm.splits[split]:
            ids, labels = ex["input_ids"], ex["labels"]
            assert all(label in (-100, t) for t, label in zip(ids, labels, strict=True))
            got.append(response_text(tok, ids, labels))
    assert sorted(got) == expected

    for row in rows:
        ids, labels, cut = encode_chat(tok, row_messages(row))
        first = next(i for i, label in enumerate(labels) if label != -100)
        assert not cut and ids[:first] == render_prompt(tok, row["prompt"])
        assert tok.decode(ids[first:]) == row["response"] + EOT
    ids, labels, _ = encode_chat(tok, row_messages({"messages": chat}))
    last = len(ids) - len(tok("epsilon" + EOT, add_special_tokens=False)["input_ids"])
    assert ids[:last] == render_prompt(tok, chat[:-1])
    # a system prompt reaches training rows and generation prompts alike
    with_system = row_messages(rows[0], system_prompt="Be brief.")
    ids, labels, _ = encode_chat(tok, with_system)
    first = next(i for i, label in enumerate(labels) if label != -100)
    assert ids[:first] == render_prompt(tok, rows[0]["prompt"], system_prompt="Be brief.")


def test_truncation_cuts_the_prompt_from_the_left_keeps_the_response_and_is_counted(
    tmp_path, tokenizer_dir, caplog
):
    long = [{"prompt": "alpha beta " * 80, "response": f"gamma {i}"} for i in range(3)]
    short = qa_rows(20)
    files = {
        "train": str(write_jsonl(tmp_path / "train.jsonl", short[:15] + long)),
        "validation": str(write_jsonl(tmp_path / "val.jsonl", short[15:])),
    }
    with caplog.at_level(logging.INFO, logger="laptrain.families.lora.instructions"):
        dm = module(tmp_path, tokenizer_dir, files=files, max_length=128, test_fraction=0.0)
        dm.setup()
    assert dm.truncated["train"] == 3 and dm.truncated["val"] == 0
    assert "3 of 18 train" in caplog.text and "data.max_length=128" in caplog.text
    responses = []
    for ex in dm.splits["train"]:
        assert len(ex["input_ids"]) <= 128
        responses.append(response_text(dm.tokenizer, ex["input_ids"], ex["labels"]))
    assert {f"gamma {i}{EOT}" for i in range(3)} <= set(responses)


def test_bad_rows_are_one_line_naming_the_first_three_by_file_and_line(tmp_path, tokenizer_dir):
    rows = [
        *qa_rows(3),
        {"prompt": "alpha"},
        {"prompt": "alpha", "response": "  "},
        "{not json",
        {"messages": [{"role": "robot", "content": "beep"}]},
        {"messages": [{"role": "user", "content": "hi"}]},
    ]
    path = write_jsonl(tmp_path / "my.jsonl", rows)
    with pytest.raises(ValueError) as err:
        module(tmp_path, tokenizer_dir, files={"train": str(path)}).setup()
    text = str(err.value)
    assert "\n" not in text
    assert f"{path}:4 (no response), {path}:5 (empty response), {path}:6 (not JSON), ..." in text
    assert "(5 bad rows of 8)" in text and "robot" not in text

    # a response that cannot fit max_length with one prompt token; CSV rows named by their line
    with (tmp_path / "my.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["prompt", "completion"])
        w.writerows([[r["prompt"], r["response"]] for r in qa_rows(4)])
        w.writerow(["alpha", "beta " * 80])
    with pytest.raises(
        ValueError, match=r"my\.csv:6 \(response alone \d+ tokens, data\.max_length 64\)"
    ):
        module(tmp_path, tokenizer_dir, files={"train": str(tmp_path / "my.csv")}).setup()


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_csv_and_parquet_give_the_same_examples_as_jsonl(tmp_path, tokenizer_dir, fmt):
    rows = qa_rows(40)
    reference = module(tmp_path, tokenizer_dir, rows)
    reference.setup()
    path = tmp_path / f"d.{fmt}"
    if fmt == "csv":
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, ["prompt", "response"])
            w.writeheader()
            w.writerows(rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    dm = module(tmp_path, tokenizer_dir, files={"train": str(path)})
    dm.setup()
    for split in ("train", "val", "test"):
        assert dm.splits[split]["input_ids"] == reference.splits[split]["input_ids"]


def test_cached_second_setup_skips_tokenizing_and_groups_stay_in_one_split(
    tmp_path, tokenizer_dir, monkeypatch
):
    rows = [dict(r, module=f"m{i % 16}") for i, r in enumerate(qa_rows(96))]
    dm = module(tmp_path, tokenizer_dir, rows, group_column="module")
    dm.prepare_data()
    dm.setup()

    def boom(*a, **k):
        raise AssertionError("tokenized again")

    monkeypatch.setattr(instructions.InstructionDataModule, "_encode", boom)
    again = module(tmp_path, tokenizer_dir, rows, group_column="module")
    again.setup()
    assert again.splits["train"]["input_ids"] == dm.splits["train"]["input_ids"]
    named = {"all": [(f"x:{i}", row_messages(r), r["module"]) for i, r in enumerate(rows)]}
    splits = dm._split_rows(named)
    modules = {s: {g for _, _, g in v} for s, v in splits.items()}
    assert all(modules["train"].isdisjoint(modules[s]) for s in ("val", "test"))
    assert modules["val"].isdisjoint(modules["test"]) and modules["val"] and modules["test"]


def test_batches_have_masks_labels_and_the_response_token_count(tmp_path, tokenizer_dir):
    dm = module(tmp_path, tokenizer_dir)
    dm.setup()
    assert dm.model_kwargs()["tokenizer"] is dm.tokenizer
    for batch in dm.train_dataloader():
        assert batch["input_ids"].dtype == batch["labels"].dtype == torch.long
        assert batch["attention_mask"].shape == batch["input_ids"].shape
        assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()
        assert int(batch["num_response_tokens"]) == int((batch["labels"] != -100).sum())
    dm.save_artifacts(tmp_path / "run")
    assert (tmp_path / "run" / "tokenizer" / "tokenizer.json").is_file()


def test_padding_to_64_bounds_the_distinct_shapes_per_micro_batch(tmp_path, tokenizer_dir):
    rows = [
        {"prompt": " ".join(WORDS[j % 11] for j in range(1 + (i * 37) % 190)), "response": "ok"}
        for i in range(160)
    ]
    max_length = 200
    dm = module(tmp_path, tokenizer_dir, rows, max_length=max_length, pad_to_multiple_of=64)
    dm.setup()
    shapes: dict[int, set[int]] = {}
    for epoch in range(2):
        loader = dm.train_dataloader()
        loader.batch_sampler.set_epoch(epoch)
        for batch in loader:
            b, t = batch["input_ids"].shape
            assert t % 64 == 0
            shapes.setdefault(b, set()).add(t)
    widths = set().union(*shapes.values())
    assert len(widths) > 1  # lengths really vary
    assert all(len(s) <= math.ceil(max_length / 64) for s in shapes.values())


def test_restored_loader_serves_exactly_the_rest_of_the_epoch(tmp_path, tokenizer_dir):
    dm = module(tmp_path, tokenizer_dir, qa_rows(120))
    dm.setup()
    full = [b["input_ids"] for b in dm.train_dataloader()]
    loader = dm.train_dataloader()
    it = iter(loader)
    seen = [next(it)["input_ids"] for _ in range(5)]
    state = loader.state_dict()
    restored = module(tmp_path, tokenizer_dir, qa_rows(120)).train_dataloader()
    restored.load_state_dict(state)
    rest = [b["input_ids"] for b in restored]
    assert len(seen + rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(seen + rest, full, strict=True))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_each_example_run_alone(tmp_path, tokenizer_dir, attn):
    from transformers import LlamaConfig, LlamaForCausalLM

    dm = module(tmp_path, tokenizer_dir, qa_rows(40), max_length=96, packing=True)
    dm.setup()
    ds, lengths = dm.items("train")
    assert len(ds) < len(dm.splits["train"]) and max(lengths) <= 96
    rows = [ds[i] for i in range(3)]
    assert any(len(r["lengths"]) > 1 for r in rows)
    batch = CausalLMCollator(dm.tokenizer.pad_token_id, 64, packed=True)(rows)
    assert batch["attention_mask"].shape == (3, 1, 128, 128)
    config = LlamaConfig(
        vocab_size=len(dm.tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation=attn,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        packed = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            position_ids=batch["position_ids"],
        ).logits
        worst = 0.0
        for b, row in enumerate(rows):
            start = 0
            for n in row["lengths"]:
                alone = model(input_ids=torch.tensor([row["input_ids"][start : start + n]])).logits
                worst = max(worst, (alone[0] - packed[b, start : start + n]).abs().max().item())
                start += n
    assert worst <= 1e-5
    # the loss sees the same labels: packing never labels a token of the next example
    assert int(batch["num_response_tokens"]) == sum(
        sum(label != -100 for label in r["labels"]) for r in rows
    )


CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_another_template_gets_its_own_end_of_turn_and_the_same_prefix_rule(tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = CHATML
    assert instructions.end_of_turn(tok) == "<|im_end|>"
    chat = [
        {"role": "user", "content": "alpha?"},
        {"role": "assistant", "content": "beta"},
        {"role": "user", "content": "gamma?"},
        {"role": "assistant", "content": "delta"},
    ]
    ids, labels, _ = encode_chat(tok, row_messages({"messages": chat}))
    assert response_text(tok, ids, labels) == "beta<|im_end|>delta<|im_end|>"
    last = len(ids) - len(tok("delta<|im_end|>", add_special_tokens=False)["input_ids"])
    assert ids[:last] == render_prompt(tok, chat[:-1])
    assert tok.decode(ids) + "\n" == tok.apply_chat_template(chat, tokenize=False)


def test_longest_example_is_the_widest_training_batch_not_max_length(tmp_path, tokenizer_dir):
    """Short pairs under a long data.max_length: the preflight sizes by this, not by 512."""
    dm = module(tmp_path, tokenizer_dir, max_length=512)
    dm.setup()
    widest = max(b["input_ids"].shape[1] for b in dm.train_dataloader())
    assert dm.longest_example("train") == widest < 100
    packed = module(tmp_path, tokenizer_dir, max_length=128, packing=True)
    packed.setup()
    rows = max(b["input_ids"].shape[1] for b in packed.train_dataloader())
    assert packed.longest_example("train") == rows <= 128 and rows > widest


def test_a_damaged_cache_entry_is_rebuilt_not_trusted(tmp_path, tokenizer_dir):
    """Entries are sealed with each file's size and sha256 (text_classification.publish_entry);
    one whose file was cut short (a crash, a partial copy) is built again."""
    dm = module(tmp_path, tokenizer_dir)
    dm.setup()
    expected = list(dm.splits["train"]["input_ids"])
    arrow = next((dm.entry / "train").glob("*.arrow"))
    good = arrow.read_bytes()
    del dm
    arrow.unlink()  # a new file: the old one may still be memory-mapped
    arrow.write_bytes(good[: len(good) // 2])
    again = module(tmp_path, tokenizer_dir)
    again.setup()
    assert list(again.splits["train"]["input_ids"]) == expected and arrow.read_bytes() == good
    assert not [p for p in (tmp_path / "c" / "instructions").iterdir() if p != again.entry]


def test_a_text_row_is_trained_on_every_token_without_the_chat_template(tmp_path, tokenizer_dir):
    """TRL's language-modeling form: the text + EOS, tokenized as it is (no chat headers, no
    system prompt), labels on every token; a text over data.max_length keeps its start (TRL's
    truncation); a tokenizer that adds BOS itself gets it, as TRL's tokenizer call does."""
    texts = [" ".join(WORDS[(i + j) % 11] for j in range(2 + i % 7)) + "." for i in range(40)]
    dm = module(tmp_path, tokenizer_dir, [{"text": t} for t in texts], system_prompt="Be brief.")
    dm.setup()
    tok = dm.tokenizer
    want = {tuple(tok(t + EOT, add_special_tokens=False)["input_ids"]) for t in texts}
    got = [dm.splits[s][i] for s in ("train", "val", "test") for i in range(len(dm.splits[s]))]
    assert len(got) == len(texts) and {tuple(ex["input_ids"]) for ex in got} == want
    for ex in got:  # every token a label (the first has nothing before it to predict it)
        assert ex["labels"][0] == -100 and ex["labels"][1:] == ex["input_ids"][1:]

    long = PlainText(" ".join(WORDS * 4))
    ids, labels, cut = encode_chat(tok, long, max_length=8)
    assert cut and ids == tok(long.text, add_special_tokens=False)["input_ids"][:8]

    from tokenizers.processors import TemplateProcessing

    bos = "<|begin_of_text|>"
    tok.backend_tokenizer.post_processor = TemplateProcessing(
        single=f"{bos} $A", special_tokens=[(bos, tok.convert_tokens_to_ids(bos))]
    )
    ids, _, _ = encode_chat(tok, PlainText("alpha beta"))
    assert ids == tok("alpha beta" + EOT)["input_ids"] and ids[0] == tok.bos_token_id


def test_train_py_trains_lora_on_a_file_of_text_rows(tmp_path):
    texts = [f"The function number {i} returns {i * 7} to its caller." for i in range(40)]
    path = write_jsonl(tmp_path / "texts.jsonl", [{"text": t} for t in texts])
    args = [*TINY_LORA, "data=instructions", f"data.files.train={path}", "debug=fast"]
    done = train_here([*args, "data.batch_size=4", "test=false", "run_name=text"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    last = tmp_path / "outputs" / "text" / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 6
