"""DPO on the LoRA family (issue 38): the loss and its statistics, the reference as the base with
the adapters off, learning a preference, continuing from a LoRA run, preference rows in every
shape and every refusal in one line, and `python train.py experiment=dpo_offline` end to end."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.data import DataLoader

from laptrain.commands.cli import main
from laptrain.data.file_formats import DataError
from laptrain.families.lora.dpo import DPOLoRAModule, dpo_terms
from laptrain.families.lora.instructions import encode_chat
from laptrain.families.lora.preference_rows import read_preferences, row_preference
from laptrain.families.lora.preferences import PairCollator
from tests.conftest import TINY_LORA
from tests.in_process import train_here
from tests.test_causal_lm_lora import (
    PAIRS,
    _one_thread,  # noqa: F401 - module fixture
    base,  # noqa: F401 - module fixture
    tokenizer,  # noqa: F401 - module fixture
    trainer,
)

DPO_JOB = [
    *[a.replace("experiment=lora_offline", "experiment=dpo_offline") for a in TINY_LORA],
    "data.builder.modules=[json,csv,base64,shlex]",
    "data.vocab_size=512",
    "data.max_length=64",
    "data.batch_size=4",
    "trainer.max_steps=4",
    "trainer.val_check_interval=2",
]


def test_dpo_terms_match_the_formula():
    policy = torch.tensor([[-10.0, -12.0], [-5.0, -4.0]])
    reference = torch.tensor([[-11.0, -11.0], [-5.0, -5.0]])
    losses, stats = dpo_terms(policy, reference, beta=0.5)
    margins = [0.5 * ((-10 + 11) - (-12 + 11)), 0.5 * ((-5 + 5) - (-4 + 5))]
    expected = [-math.log(1 / (1 + math.exp(-m))) for m in margins]
    assert torch.allclose(losses, torch.tensor(expected))
    assert stats["reward_accuracy"].tolist() == [1.0, 0.0]
    assert torch.allclose(stats["reward_margin"], torch.tensor(margins))
    assert stats["logps_chosen"].tolist() == [-10.0, -5.0]


# ----- the module ---------------------------------------------------------------------------
def _pairs(tokenizer):  # noqa: F811
    """Each question with its own answer chosen and the next question's answer rejected."""
    rows = []
    for i, (prompt, answer) in enumerate(PAIRS):
        wrong = PAIRS[(i + 1) % len(PAIRS)][1]
        row = {}
        for side, text in (("chosen", answer), ("rejected", wrong)):
            messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": text}]
            row[f"{side}_ids"], row[f"{side}_labels"], _ = encode_chat(tokenizer, messages)
        rows.append(row)
    return rows


def _loader(tokenizer, batch_size=4):  # noqa: F811
    return DataLoader(
        _pairs(tokenizer), batch_size=batch_size, collate_fn=PairCollator(tokenizer.pad_token_id)
    )


def _module(tokenizer, base, **kw):  # noqa: F811
    return DPOLoRAModule(
        tokenizer,
        pretrained=base,
        lora={"r": 8},
        optimizer=lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.0),
        **kw,
    )


def test_at_the_start_the_reference_is_the_model_and_the_loss_is_log_2(tokenizer, base):  # noqa: F811
    """LoRA's B starts at zero: the model with adapters equals the base without them."""
    module = _module(tokenizer, base).eval()
    batch = next(iter(_loader(tokenizer)))
    with torch.no_grad():
        policy, reference = module.pair_logps(batch)
    assert torch.equal(policy, reference)
    losses, _ = dpo_terms(policy, reference, 0.1)
    assert torch.allclose(losses, torch.full_like(losses, math.log(2)))


def test_dpo_learns_to_prefer_the_chosen_answers(tokenizer, base, tmp_path):  # noqa: F811
    torch.manual_seed(0)
    module = _module(tokenizer, base)
    fit = trainer(tmp_path, max_steps=30)
    fit.fit(module, train_dataloaders=_loader(tokenizer))
    module.eval()
    with torch.no_grad():
        policy, reference = module.pair_logps(next(iter(_loader(tokenizer, 8))))
    _, stats = dpo_terms(policy, reference, module.beta)
    assert stats["reward_accuracy"].mean() == 1.0 and stats["reward_margin"].min() > 0.5
    # the base itself ranks them as a coin does: what changed is the adapters
    assert (reference[:, 0] > reference[:, 1]).float().mean() < 1.0


def test_init_adapters_continues_from_a_lora_run_and_refuses_another_rank(
    tokenizer,  # noqa: F811
    base,  # noqa: F811
    tmp_path,
):
    torch.manual_seed(0)
    lora = _module(tokenizer, base)
    trainer(tmp_path / "lora", max_steps=3).fit(lora, train_dataloaders=_loader(tokenizer))
    lora.export(tmp_path / "run" / "adapter")
    batch = next(iter(_loader(tokenizer)))
    continued = _module(tokenizer, base, init_adapters=str(tmp_path / "run")).eval()
    with torch.no_grad():
        assert torch.equal(continued.pair_logps(batch)[0], lora.eval().pair_logps(batch)[0])
    with pytest.raises(ValueError, match="model.lora.r") as err:
        DPOLoRAModule(
            tokenizer, pretrained=base, lora={"r": 4}, init_adapters=str(tmp_path / "run")
        )
    assert "\n" not in str(err.value)


def test_beta_must_be_positive(tokenizer, base):  # noqa: F811
    with pytest.raises(ValueError, match="beta > 0"):
        DPOLoRAModule(tokenizer, pretrained=base, beta=0.0)


# ----- rows -----------------------------------------------------------------------------------
CONVERSATION = [{"role": "user", "content": "What does `json.dumps` do?"}]
ANSWER = {"role": "assistant", "content": "Serialize obj."}
NO = {"role": "assistant", "content": "No."}


@pytest.mark.parametrize(
    "row",
    [
        {"prompt": "What does `json.dumps` do?", "chosen": "Serialize obj.", "rejected": "No."},
        {"messages": CONVERSATION, "chosen": "Serialize obj.", "rejected": "No."},
        {"messages": json.dumps(CONVERSATION), "chosen": "Serialize obj.", "rejected": "No."},
        {
            "chosen": [*CONVERSATION, {"role": "assistant", "content": "Serialize obj."}],
            "rejected": json.dumps([*CONVERSATION, {"role": "assistant", "content": "No."}]),
        },
        # TRL's conversational explicit prompt (issue 48 item 8), as objects and as CSV cells
        {"prompt": CONVERSATION, "chosen": [ANSWER], "rejected": [NO]},
        {
            "prompt": json.dumps(CONVERSATION),
            "chosen": json.dumps([ANSWER]),
            "rejected": json.dumps([NO]),
        },
        # TRL's standard implicit prompt: the shared beginning is the prompt
        {
            "chosen": "What does `json.dumps` do? Serialize obj.",
            "rejected": "What does `json.dumps` do? No.",
        },
    ],
)
def test_every_row_shape_reads_as_the_same_preference(row):
    assert row_preference(row) == (CONVERSATION, "Serialize obj.", "No.")


@pytest.mark.parametrize(
    "row, why",
    [
        ({"prompt": "q", "rejected": "b"}, "no chosen"),
        ({"prompt": "q", "chosen": "a"}, "no rejected"),
        ({"prompt": "q", "chosen": "same", "rejected": "same "}, "chosen equals rejected"),
        ({"prompt": "  ", "chosen": "a", "rejected": "b"}, "empty prompt"),
        ({"chosen": "a", "rejected": "b"}, "no prompt"),
        (
            {
                "chosen": [*CONVERSATION, {"role": "assistant", "content": "a"}],
                "rejected": [
                    {"role": "user", "content": "other"},
                    {"role": "assistant", "content": "b"},
                ],
            },
            "prompts differ",
        ),
        ({"prompt": "q", "chosen": {"text": "a"}, "rejected": "b"}, "chosen is dict, not a string"),
        ({"prompt": 7, "chosen": "a", "rejected": "b"}, "prompt is int, not a string"),
        ({"prompt": "q", "chosen": ["a"], "rejected": "b"}, "chosen is list, not a string"),
        ({"prompt": "q", "chosen": [ANSWER, NO], "rejected": [NO]}, "not one assistant message"),
        ({"prompt": [*CONVERSATION, NO], "chosen": [ANSWER], "rejected": [NO]}, "prompt ends"),
    ],
)
def test_bad_rows_say_why(row, why):
    assert why in row_preference(row)


def test_bad_rows_are_named_by_line_in_one_error(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "q1", "chosen": "a", "rejected": "b"},
        {"prompt": "q2", "chosen": "a", "rejected": "a"},
        {"prompt": "q3", "chosen": "a"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError) as err:
        read_preferences({"train": str(path)})
    message = str(err.value)
    assert f"{path}:2 (chosen equals rejected)" in message and f"{path}:3 (no rejected)" in message
    assert "(2 bad rows of 3)" in message and "\n" not in message


# ----- end to end through train.py ----------------------------------------------------------
def test_train_py_dpo_offline_reports_the_dpo_metrics_exports_and_evals(tmp_path, capsys):
    done = train_here([*DPO_JOB, "run_name=d"], tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "outputs" / "d"
    metrics = json.loads((run / "metrics.json").read_text())
    flat = json.dumps(metrics)
    for key in ("val/loss", "val/reward_accuracy", "val/reward_margin", "test/reward_accuracy"):
        assert key in flat, key
    assert "reward_accuracy" in done.stdout
    assert (run / "adapter" / "adapter_config.json").is_file()
    assert main(["export", str(run), "--out", str(tmp_path / "merged")]) == 0
    assert (tmp_path / "merged" / "config.json").is_file()
    # `laptrain eval <run> --data pairs.jsonl`: the metrics a DPO run logs, on that file
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"prompt": "What does `json.dumps` do?", "chosen": "Serialize obj.", "rejected": "No."},
        {"prompt": "What does `csv.reader` do?", "chosen": "Read rows.", "rejected": "Write."},
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(pairs)]) == 0
    out = capsys.readouterr().out
    assert "| DPO loss (beta 0.1) |" in out and "| reward accuracy |" in out
    assert "2 pairs; the base alone prefers the chosen answer in" in out


def _bad_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "q", "chosen": "same", "rejected": "same"}) + "\n")
    return path


@pytest.mark.parametrize(
    "extra, words",
    [
        (["model.beta=0"], ["beta > 0"]),
        (["+data.packing=true"], ["data.packing=false"]),
    ],
)
def test_train_py_refuses_bad_dpo_settings_in_one_line(tmp_path, extra, words):
    done = train_here([*DPO_JOB, *extra, "run_name=bad"], tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert all(w in last for w in words), done.stderr[-2000:]
    assert not (tmp_path / "outputs" / "bad" / "checkpoints").exists()


def test_train_py_refuses_a_bad_preference_file_in_one_line(tmp_path):
    path = _bad_file(tmp_path)
    job = [a for a in DPO_JOB if not a.startswith("data.builder")]
    args = [*job, "data=preferences", f"data.files.train={path}", "run_name=bad"]
    done = train_here(args, tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"{path}:1 (chosen equals rejected)" in last
    assert not (tmp_path / "outputs" / "bad").exists()


def test_conversations_need_the_bases_own_chat_template(tmp_path):
    from laptrain.families.lora.chat_tokenizer import build_offline_tokenizer
    from laptrain.families.lora.preferences import PreferenceDataModule

    plain = build_offline_tokenizer([p for p, _ in PAIRS] * 20, vocab_size=300)
    plain.chat_template = None
    plain.save_pretrained(str(tmp_path / "plain"))
    talk = [
        {"role": "user", "content": "What does `json.dumps` do?"},
        {"role": "assistant", "content": "It serializes."},
        {"role": "user", "content": "And json.loads?"},
    ]
    rows = tmp_path / "pairs.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"messages": talk, "chosen": f"It parses {i}.", "rejected": "No."}) + "\n"
            for i in range(20)
        )
    )

    def module(path):
        return PreferenceDataModule(
            files={"train": str(path)}, tokenizer=str(tmp_path / "plain"), batch_size=2,
            cache_dir=str(tmp_path / "cache"), max_length=64,
        )  # fmt: skip

    with pytest.raises(DataError, match="no chat template of its own") as err:
        module(rows).prepare_data()
    assert f"{rows}:" in str(err.value) and "\n" not in str(err.value)
    one_turn = tmp_path / "one_turn.jsonl"
    one_turn.write_text(
        "".join(
            json.dumps({"prompt": f"q{i}?", "chosen": f"a{i}.", "rejected": "No."}) + "\n"
            for i in range(20)
        )
    )
    module(one_turn).prepare_data()  # a one-turn prompt reads the same under either template
