"""`laptrain export <run> --format gguf` (issue 37, items 1, 2, 5): a LoRA run trained through
train.py, merged and written as GGUF, read back by transformers' own GGUF loader (not by ours),
compared with the merged transformers model, and fine-tuned again from the file; the Modelfile's
Go template renders what the Jinja chat template renders; every refusal is one line, exit 2, and
writes nothing. llama.cpp itself reads the file in tests/test_gguf_llama_cpp.py (slow)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laptrain.commands.cli import main
from laptrain.console import no_transformers_bars
from laptrain.families.lora.chat_tokenizer import LLAMA3_CHAT_TEMPLATE
from laptrain.families.lora.gguf import llama_metadata, modelfile, vocab
from laptrain.families.lora.gguf.llama_tensors import encode, interleave_rope_rows
from tests.conftest import TINY_LORA
from tests.in_process import train_here

LORA_JOB = [
    *TINY_LORA,
    "data.builder.modules=[json,csv,base64,shlex]",
    "data.vocab_size=512",
    "data.max_length=64",
    "data.batch_size=4",
    "trainer.max_steps=3",
    "trainer.val_check_interval=3",
    "test=false",
]
PROBE_TEXT = [
    "Serialize obj to a JSON formatted str.",
    "Return a list of the words in the string, using sep as the delimiter string.",
    "Encode the bytes-like object s using Base64 and return the encoded bytes.",
]
CHATML_WITH_DEFAULT_SYSTEM = (  # the shape of SmolLM2's template: a default system prompt
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """`python train.py experiment=lora_offline ...` (3 steps) with the default callbacks."""
    root = tmp_path_factory.mktemp("gguf")
    done = train_here([*LORA_JOB, "run_name=g"], root, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "outputs" / "g"


@pytest.fixture(scope="module")
def merged(lora_run, tmp_path_factory):
    """The same adapter merged by `laptrain export` into a transformers folder: the reference."""
    out = tmp_path_factory.mktemp("merged") / "m"
    assert main(["export", str(lora_run), "--out", str(out)]) == 0
    with no_transformers_bars():
        model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(str(out))


def _read_back(folder: Path):
    with no_transformers_bars():
        model = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file="model.gguf").eval()
    return model, AutoTokenizer.from_pretrained(str(folder), gguf_file="model.gguf")


def _log_probs(model, ids):
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), dim=-1)


def _token_nll(log_probs, ids) -> torch.Tensor:
    """Each next token's negative log-probability."""
    return -log_probs[0, :-1].gather(-1, ids[0, 1:, None]).flatten()


@pytest.mark.parametrize("quant", ["f16", "q8_0"])
def test_the_exported_gguf_reads_back_in_transformers_and_agrees_with_the_merged_model(
    lora_run, merged, quant, capsys
):
    """f16: the same next token everywhere, log-probabilities within 0.02; q8_0: the perplexity
    of the probe texts within 1 % of the merged float32 model's (the bounds docs/gguf_export.md
    states). The q8_0 figure is over all probe tokens together, as llama.cpp's check counts it:
    one 10-token text of this 32-wide model moves by about 1 % with the last bit of a block's
    rounding (1.008 with blocks from float32, 1.012 from float16: two valid q8_0 files)."""
    assert main(["export", str(lora_run), "--format", "gguf", "--quant", quant]) == 0
    out = capsys.readouterr().out
    folder = lora_run / f"gguf-{quant}"
    assert f"GGUF ({quant}," in out and str(folder / "model.gguf") in out
    assert f"ollama create NAME -f {folder / 'Modelfile'}" in out
    assert not [p for p in lora_run.iterdir() if p.name.endswith((".partial", ".old"))]

    reference, ref_tokenizer = merged
    model, tokenizer = _read_back(folder)
    agree, worst, nll_ours, nll_theirs = [], 0.0, [], []
    for text in PROBE_TEXT:
        ids = ref_tokenizer(text, return_tensors="pt").input_ids
        assert tokenizer(text).input_ids == ids[0].tolist()  # the GGUF's tokenizer splits alike
        ours, theirs = _log_probs(model, ids), _log_probs(reference, ids)
        agree.append((ours.argmax(-1) == theirs.argmax(-1)).float().mean().item())
        worst = max(worst, (ours - theirs).abs().max().item())
        nll_ours.append(_token_nll(ours, ids))
        nll_theirs.append(_token_nll(theirs, ids))
    if quant == "f16":
        assert min(agree) == 1.0 and worst < 0.02, (agree, worst)
    ratio = float(torch.exp(torch.cat(nll_ours).mean() - torch.cat(nll_theirs).mean()))
    assert abs(ratio - 1) < 0.01, ratio  # measured 1.0053


def test_the_modelfile_names_the_file_and_the_end_of_turn_token(lora_run, capsys):
    assert main(["export", str(lora_run), "--format", "gguf"]) == 0
    capsys.readouterr()
    text = (lora_run / "gguf-f16" / "Modelfile").read_text()
    assert text.startswith('FROM ./model.gguf\nTEMPLATE """')
    assert 'PARAMETER stop "<|eot_id|>"' in text


def test_a_new_fine_tune_starts_from_the_exported_gguf(lora_run, tmp_path, capsys):
    """The round trip: `model.pretrained=<the exported .gguf>` trains through train.py."""
    assert main(["export", str(lora_run), "--format", "gguf", "--out", str(tmp_path / "e")]) == 0
    capsys.readouterr()
    gguf_file = tmp_path / "e" / "model.gguf"
    args = [*LORA_JOB, f"model.pretrained={gguf_file}", "run_name=again"]
    done = train_here(args, tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    adapter = json.loads(
        (tmp_path / "outputs" / "again" / "adapter" / "adapter_config.json").read_text()
    )
    assert (tmp_path / "cache" / "models" / "gguf").is_dir()
    assert "models/gguf" in adapter["base_model_name_or_path"]


# ----- the Modelfile's template -----------------------------------------------------------------
def _go(template: str, system: str | None, messages: list[dict[str, str]]) -> str:
    """Evaluate the Go-template subset the Modelfile uses (if .System / else / end, range
    .Messages, if eq .Role "x" / else if / end, .System, .Content): enough to check its text."""
    tokens = re.split(r"(\{\{.*?\}\})", template)
    out = []

    def block(i: int, env: dict, emit: bool) -> int:
        while i < len(tokens):
            tok = tokens[i]
            if not tok.startswith("{{"):
                if emit:
                    out.append(tok)
                i += 1
                continue
            action = tok[2:-2].strip()
            if action in ("end", "else") or action.startswith("else if"):
                return i
            if action == ".System":
                out.append(env["system"] or "") if emit else None
                i += 1
            elif action == ".Content":
                out.append(env["message"]["content"]) if emit else None
                i += 1
            elif action.startswith('"'):
                out.append(json.loads(action)) if emit else None
                i += 1
            elif action == "range .Messages":
                start = i + 1
                for message in messages if emit else [None]:
                    i = block(start, {**env, "message": message}, emit)
                if not (emit and messages):
                    i = block(start, env, False)
                i += 1
            elif action.startswith("if "):
                taken = False
                cond = action[3:]
                while True:
                    truth = _truth(cond, env)
                    i = block(i + 1, env, emit and truth and not taken)
                    taken = taken or truth
                    action = tokens[i][2:-2].strip()
                    if action == "end":
                        i += 1
                        break
                    cond = action[len("else if ") :] if action.startswith("else if") else "true"
            else:
                raise AssertionError(f"unexpected action {tok}")
        return i

    def _truth(cond: str, env: dict) -> bool:
        if cond == "true":
            return True
        if cond == ".System":
            return bool(env["system"])
        role = re.fullmatch(r'eq \.Role "(\w+)"', cond)
        assert role, cond
        return env["message"]["role"] == role.group(1)

    block(0, {"system": system, "message": None}, True)
    return "".join(out)


def _tokenizer_with(template: str):
    from laptrain.families.lora.chat_tokenizer import build_offline_tokenizer

    tokenizer = build_offline_tokenizer(PROBE_TEXT * 20, vocab_size=300)
    tokenizer.chat_template = template
    return tokenizer


@pytest.mark.parametrize("template", [LLAMA3_CHAT_TEMPLATE, CHATML_WITH_DEFAULT_SYSTEM])
def test_the_go_template_renders_what_the_jinja_template_renders(template):
    tokenizer = _tokenizer_with(template)
    text = modelfile.modelfile("model.gguf", tokenizer, ["<|eot_id|>"])
    go = re.search(r'TEMPLATE """(.*)"""', text, re.S).group(1)
    turns = [
        {"role": "user", "content": "What does `json.dumps` do?"},
        {"role": "assistant", "content": "Serialize obj to a JSON formatted str."},
        {"role": "user", "content": "And {{ json.loads }}?"},
    ]
    for system in (None, "Answer in one sentence."):
        messages = ([{"role": "system", "content": system}] if system else []) + turns
        jinja = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        # Ollama passes a system message as .System and keeps it out of the turns it ranges over
        assert _go(go, system, turns) == jinja


def test_a_template_whose_turns_change_later_is_refused_in_one_line():
    numbered = (
        "{% for m in messages %}{{ loop.length }}:{{ m['role'] }}:{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
    )
    with pytest.raises(ValueError, match="cannot be written as an Ollama template") as err:
        modelfile.modelfile("model.gguf", _tokenizer_with(numbered), [])
    assert "\n" not in str(err.value)


# ----- format facts -------------------------------------------------------------------------
def test_llama3_rope_factors_match_transformers_own_llama3_frequencies():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = LlamaConfig(
        hidden_size=128, num_attention_heads=2, max_position_embeddings=131072,
        rope_parameters=rope,
    )  # fmt: skip
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    plain = 1.0 / (500000.0 ** (torch.arange(0, 64, 2, dtype=torch.float32) / 64))
    factors = torch.from_numpy(llama_metadata.llama3_rope_factors(config))
    assert torch.allclose(plain / factors, scaled.float(), rtol=1e-5)


def test_rope_rows_interleave_per_head():
    weight = torch.arange(8.0).reshape(8, 1)  # 2 heads of 4 rows: [0 1 | 2 3] per head
    assert interleave_rope_rows(weight, 2).flatten().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_quantised_blocks_come_from_float16_values_as_llama_quantize_makes_them():
    """llama.cpp's llama-quantize reads the f16 file: its q8_0 blocks are those of the values
    rounded to float16. laptrain's are the same (the slow llama.cpp test compares whole files)."""
    import gguf
    import numpy as np

    data = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32) * 0.02
    rounded = data.astype(np.float16).astype(np.float32)
    for qtype in (gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.Q4_0):
        assert np.array_equal(encode(data, qtype), gguf.quants.quantize(rounded, qtype))
    direct = gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0)
    assert not np.array_equal(encode(data, gguf.GGMLQuantizationType.Q8_0), direct)
    f16 = encode(data, gguf.GGMLQuantizationType.F16)
    assert np.array_equal(f16, gguf.quants.quantize(data, gguf.GGMLQuantizationType.F16))


def test_pre_tokenizer_names_follow_what_the_tokenizer_runs():
    gpt2 = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    assert vocab.pre_tokenizer_name(gpt2) == "gpt-2"
    digits = {"type": "Digits", "individual_digits": True}
    assert vocab.pre_tokenizer_name({"type": "Sequence", "pretokenizers": [digits, gpt2]}) == (
        "smollm"
    )
    split = {
        "type": "Split",
        "pattern": {"Regex": vocab.LLAMA3_SPLIT},
        "behavior": "Isolated",
        "invert": False,
    }
    bare = {**gpt2, "use_regex": False}
    assert vocab.pre_tokenizer_name({"type": "Sequence", "pretokenizers": [split, bare]}) == (
        "llama-bpe"
    )
    assert vocab.pre_tokenizer_name({"type": "Whitespace"}) is None


# ----- bad input: one line, exit 2, nothing written -------------------------------------------
def _refused(capsys, args: list[str], *words: str) -> str:
    assert main(args) == 2
    captured = capsys.readouterr()
    message = captured.err.strip()
    assert message.startswith("error: ") and "\n" not in message, captured.err
    for word in words:
        assert word in message, message
    return message


def _fake_run(tmp_path: Path, target: str) -> Path:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(f"model:\n  _target_: {target}\n")
    return run


def test_a_classifier_run_is_refused(tmp_path, capsys):
    run = _fake_run(tmp_path, "laptrain.families.classifier.module.TextClassifier")
    _refused(capsys, ["export", str(run), "--format", "gguf"], "TextClassifier", "LoRA")
    assert sorted(p.name for p in run.iterdir()) == [".hydra"]


def test_a_lora_run_without_adapters_is_refused(tmp_path, capsys):
    run = _fake_run(tmp_path, "laptrain.families.lora.causal_lm.CausalLMLoRAModule")
    _refused(capsys, ["export", str(run), "--format", "gguf"], "adapter_config.json")
    assert sorted(p.name for p in run.iterdir()) == [".hydra"]


def test_an_unknown_quant_and_quant_without_gguf_are_refused(lora_run, capsys):
    _refused(capsys, ["export", str(lora_run), "--format", "gguf", "--quant", "q4_k_m"], "f16")
    _refused(capsys, ["export", str(lora_run), "--quant", "q8_0"], "--format gguf")
    assert not (lora_run / "gguf-q4_k_m").exists()


def test_a_base_of_another_architecture_is_refused_before_loading(lora_run, tmp_path, capsys):
    adapter = tmp_path / "adapter"
    shutil.copytree(lora_run / "adapter", adapter)
    base = tmp_path / "gpt2-base"
    base.mkdir()
    (base / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(base)})
    )
    _refused(capsys, ["export", str(adapter), "--format", "gguf"], "GPT2LMHeadModel", "Llama")
    assert not (tmp_path / "adapter-gguf-f16").exists()


def test_not_enough_disk_is_refused_before_writing(lora_run, monkeypatch, capsys):
    import laptrain.commands.export_folder as export_folder

    monkeypatch.setattr(
        export_folder.shutil, "disk_usage", lambda _p: shutil._ntuple_diskusage(10**9, 10**9, 1024)
    )
    _refused(
        capsys,
        ["export", str(lora_run), "--format", "gguf", "--out", str(lora_run / "tight")],
        "not enough disk",
        "--out",
    )
    assert not (lora_run / "tight").exists()
    assert not any(p.name.startswith(".tight") for p in lora_run.iterdir())


def test_a_tokenizer_llama_cpp_cannot_name_is_refused(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    from laptrain.commands.export_folder import export_target
    from laptrain.families.lora.gguf.write import write_gguf

    tok = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=2, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2)
    )  # fmt: skip
    with pytest.raises(ValueError, match="pre-tokenizer") as err:
        target = export_target(tmp_path / "g", "gguf")
        write_gguf(model, tokenizer, target, "f16", "t", lambda _n: None)
    assert "\n" not in str(err.value) and not (tmp_path / "g").exists()


def test_the_llama_cpp_check_without_its_extra_names_the_install(monkeypatch, tmp_path):
    import sys

    from laptrain.families.lora.gguf.llama_cpp_check import load_llama_cpp

    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import fails as when not installed
    with pytest.raises(ValueError, match=r"\.\[llamacpp\]") as err:
        load_llama_cpp(tmp_path / "model.gguf")
    assert "\n" not in str(err.value)


def test_modelfile_stops_read_back_whole_as_ollama_parses_them(tmp_path):
    """Issue 48 item 9: Ollama's parser (parser/parser.go) has no escapes: a value ends at the
    first line break where it is whole in "..." or \"\"\"...\"\"\"; nothing may add a line."""
    from types import SimpleNamespace

    from laptrain.families.lora.gguf.modelfile import modelfile, read_value

    stops = ["<|eot_id|>", 'say "hi"\nbye', 'back\\slash"quote']
    text = modelfile("model.gguf", SimpleNamespace(chat_template=None), stops)
    assert text == (
        "FROM ./model.gguf\n"
        'PARAMETER stop "<|eot_id|>"\n'
        'PARAMETER stop """say "hi"\nbye"""\n'
        'PARAMETER stop "back\\slash"quote"\n'
    )
    rest, read = text.split("\n", 1)[1], []
    while rest:
        assert rest.startswith("PARAMETER stop ")
        value, rest = read_value(rest.removeprefix("PARAMETER stop "))
        read.append(value)
    assert read == stops
    with pytest.raises(ValueError, match="cannot be written as an Ollama PARAMETER stop") as err:
        modelfile("model.gguf", SimpleNamespace(chat_template=None), ['a"""\nb"'])
    assert "\n" not in str(err.value)
