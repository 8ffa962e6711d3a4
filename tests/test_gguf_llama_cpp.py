"""The issue-37 acceptance on the real model (slow, needs the `llamacpp` extra): a SmolLM2-135M
LoRA run through train.py (`experiment=lora_smollm2`, fewer steps), exported as f16 and q8_0 GGUF,
loaded by llama.cpp itself (llama-cpp-python) and compared with the merged transformers model on
held-out texts; transformers' GGUF loader reads the file back and a new fine-tune starts from it.

Bounds (docs/gguf_export.md has the measured figures): f16 top-1 next token equal on >= 99 % of
positions and no log-probability more than 0.25 apart; q8_0 the model's top-1 next token on >= 95 %
of positions, and a perplexity at most 3 % (answers) and 5 % (whole texts) above the f16 file's;
llama.cpp tokenizes every text as transformers does;
the q8_0 and q4_0 files are tensor for tensor what llama.cpp's own quantizer makes of the f16 file."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laptrain.commands.cli import main
from laptrain.console import no_transformers_bars
from tests.in_process import train_here

pytestmark = pytest.mark.slow
llama_cpp_check = pytest.importorskip("laptrain.families.lora.gguf.llama_cpp_check")
pytest.importorskip("llama_cpp", reason="pip install -e '.[llamacpp]'")

JOB = [
    "experiment=lora_smollm2",
    "trainer.max_steps=20",
    "trainer.val_check_interval=20",
    "test=false",
]


@pytest.fixture(scope="module")
def smollm2_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("smol")
    done = train_here([*JOB, "run_name=smol"], root)
    assert done.returncode == 0, done.stderr[-3000:]
    run = root / "outputs" / "smol"
    assert main(["export", str(run), "--out", str(root / "merged")]) == 0
    with no_transformers_bars():
        model = AutoModelForCausalLM.from_pretrained(str(root / "merged"), dtype=torch.float32)
    return run, model.eval(), AutoTokenizer.from_pretrained(str(root / "merged"))


@pytest.fixture(scope="module")
def scored(smollm2_run):
    run, model, tokenizer = smollm2_run
    texts, starts = llama_cpp_check.held_out_texts(tokenizer, 80)
    found, replies = {}, {}
    for quant in ("f16", "q8_0"):
        assert main(["export", str(run), "--format", "gguf", "--quant", quant]) == 0
        llm = llama_cpp_check.load_llama_cpp(run / f"gguf-{quant}" / "model.gguf")
        found[quant] = llama_cpp_check.compare(llm, model, tokenizer, texts, starts)
        replies[quant] = [
            llama_cpp_check.greedy_replies(llm, model, tokenizer, q)
            for q in llama_cpp_check.QUESTIONS
        ]
        llm.close()
    return found, replies


def test_llama_cpp_reads_the_f16_file_as_the_merged_model(scored):
    found, replies = scored
    f16 = found["f16"]
    assert f16.same_tokens == 1.0
    assert f16.top1 >= 0.99 and f16.max_abs_logprob < 0.25, f16
    for question, (cpp, hf) in zip(llama_cpp_check.QUESTIONS, replies["f16"], strict=True):
        print(f"{question}\n  llama.cpp:    {cpp}\n  transformers: {hf}")
        assert cpp == hf


def test_the_q8_0_file_keeps_the_models_predictions(scored):
    """What q8_0 must keep, on any CPU: the model's most likely next token at >= 95 % of positions
    (measured 98.57 %; q4_0 67.89 %) and a perplexity at most 3 % above the f16 file's over the
    answers and 5 % over the whole texts (two machines measured answers 1.0022 and 0.9933, whole
    texts 1.0096 and 0.9891; q4_0 1.2756 and 1.1178). One-sided: q8_0 scoring below f16 is
    rounding, not a loss; a two-sided 1 % bound on the whole text sat inside that rounding's swing
    (about 2 %, docs/gguf_export.md) and failed on an AMD EPYC."""
    found, _ = scored
    q8, f16 = found["q8_0"], found["f16"]
    whole = q8.ppl_llama_cpp / f16.ppl_llama_cpp
    answers = q8.answer_ppl_llama_cpp / f16.answer_ppl_llama_cpp
    assert q8.same_tokens == 1.0
    assert q8.top1 >= 0.95 and answers <= 1.03 and whole <= 1.05, (whole, answers, found)


@pytest.mark.parametrize(("quant", "ftype"), [("q8_0", 7), ("q4_0", 2)])  # LLAMA_FTYPE_MOSTLY_*
def test_a_quantised_file_is_what_llama_quantize_makes_of_the_f16_file(
    smollm2_run, tmp_path, quant, ftype
):
    """llama.cpp's own quantizer (llama_model_quantize, the library behind llama-quantize) on
    laptrain's f16 export, the tied head kept in f16 as laptrain keeps it: every tensor the same."""
    import ctypes

    import gguf
    import llama_cpp
    import numpy as np

    run = smollm2_run[0]
    for q in ("f16", quant):
        if not (run / f"gguf-{q}" / "model.gguf").is_file():
            assert main(["export", str(run), "--format", "gguf", "--quant", q]) == 0
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    params.token_embedding_type = int(gguf.GGMLQuantizationType.F16)
    theirs = tmp_path / "llama-quantize.gguf"
    source = str(run / "gguf-f16" / "model.gguf").encode()
    assert llama_cpp.llama_model_quantize(source, str(theirs).encode(), ctypes.byref(params)) == 0
    ours = {t.name: t for t in gguf.GGUFReader(run / f"gguf-{quant}" / "model.gguf").tensors}
    reference = {t.name: t for t in gguf.GGUFReader(theirs).tensors}
    assert ours.keys() == reference.keys()
    for name, tensor in ours.items():
        assert tensor.tensor_type == reference[name].tensor_type, name
        assert np.array_equal(np.asarray(tensor.data), np.asarray(reference[name].data)), name


def test_the_exported_file_reads_back_in_transformers_and_trains_again(smollm2_run, tmp_path):
    run, model, tokenizer = smollm2_run
    gguf_file = run / "gguf-f16" / "model.gguf"
    if not gguf_file.is_file():
        assert main(["export", str(run), "--format", "gguf"]) == 0
    with no_transformers_bars():
        back = AutoModelForCausalLM.from_pretrained(str(gguf_file.parent), gguf_file=gguf_file.name)
    ids = tokenizer("Serialize obj to a JSON formatted str.", return_tensors="pt").input_ids
    with torch.no_grad():
        same = back.eval()(ids).logits.argmax(-1) == model(ids).logits.argmax(-1)
    assert same.float().mean() >= 0.99
    args = [*JOB, f"model.pretrained={gguf_file}", "trainer.max_steps=2", "run_name=again"]
    done = train_here(args, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "outputs" / "again" / "adapter" / "adapter_config.json").is_file()
