"""laptrain export / generate / eval, and memorisation end to end (issue 12, items 2 and 8)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laptrain.commands.cli import main
from laptrain.data.instructions import render_prompt
from laptrain.model.lora.causal_lm import CausalLMLoRAModule
from laptrain.model.lora.tools import (
    evaluate,
    export_merged,
    find_adapter,
    generate,
    load_for_generation,
)
from tests.test_causal_lm_lora import (
    PAIRS,
    _one_thread,  # noqa: F401 - module fixture
    base,  # noqa: F401 - module fixture
    examples,
    loader,
    tokenizer,  # noqa: F401 - module fixture
    trainer,
)


def constant_adamw(params):
    return torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)


@pytest.fixture(scope="module")
def trained_run(tokenizer, base, tmp_path_factory):  # noqa: F811
    """r 8 all-linear on 8 pairs, constant lr 1e-2, 100 steps of the whole set; run folder."""
    run = tmp_path_factory.mktemp("run")
    torch.manual_seed(0)
    module = CausalLMLoRAModule(tokenizer, pretrained=base, lora={"r": 8}, optimizer=constant_adamw)
    fit = trainer(run, max_steps=100, log_every_n_steps=1)
    losses = []

    class Record(pl_callback()):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            losses.append(float(trainer.callback_metrics["train/loss"]))

    fit.callbacks.append(Record())
    fit.fit(module, train_dataloaders=loader(tokenizer, examples(tokenizer), 8))
    module.export(run / "adapter")
    return run, losses


def pl_callback():
    import lightning.pytorch as pl

    return pl.Callback


def test_memorises_8_pairs_and_the_merged_export_reproduces_them(trained_run, tmp_path):
    run, losses = trained_run
    assert min(losses) < 0.05, losses[-5:]
    merged_dir = export_merged(run, tmp_path / "merged")
    model = AutoModelForCausalLM.from_pretrained(str(merged_dir)).eval()  # plain transformers
    tok = AutoTokenizer.from_pretrained(str(merged_dir))
    replies = [generate(model, tok, p, max_new_tokens=40, stream=False) for p, _ in PAIRS]
    assert replies == [r for _, r in PAIRS]


def test_generate_streams_and_stops_at_end_of_turn(trained_run, capsys):
    run, _ = trained_run
    model, tok = load_for_generation(run)
    prompt, response = PAIRS[0]
    reply = generate(model, tok, prompt, max_new_tokens=60)
    assert reply == response
    assert response in capsys.readouterr().out
    ids = torch.tensor([render_prompt(tok, prompt)])
    out = model.generate(
        input_ids=ids, max_new_tokens=60, do_sample=False, eos_token_id=tok.eos_token_id
    )
    assert out[0, -1] == tok.convert_tokens_to_ids("<|eot_id|>")  # stopped there, not at the limit
    assert main(["generate", str(run), "--prompt", prompt, "--max-new-tokens", "40"]) == 0
    assert response in capsys.readouterr().out


def test_eval_prints_base_vs_adapter(trained_run, tmp_path, capsys):
    run, _ = trained_run
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in PAIRS))
    result = evaluate(run, data)
    assert result.adapter_loss < 0.1 < result.base_loss
    assert result.examples == 8 and result.tokens > 8
    assert main(["eval", str(run), "--data", str(data)]) == 0
    table = capsys.readouterr().out
    assert "| base |" in table and "| adapter (" in table and "perplexity" in table


def test_export_from_a_run_folder_and_missing_adapter_config(trained_run, tmp_path, capsys):
    run, _ = trained_run
    assert find_adapter(run) == run / "adapter"
    assert main(["export", str(run / "adapter"), "--out", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "config.json").is_file() and (
        tmp_path / "m" / "tokenizer.json"
    ).is_file()
    capsys.readouterr()

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="adapter_config.json") as err:
        find_adapter(empty)
    assert "\n" not in str(err.value)
    assert main(["export", str(empty)]) == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("error: no adapter_config.json") and "\n" not in message
