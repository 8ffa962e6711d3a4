"""``laptrain preflight``: a causal-LM LoRA job's memory estimate from config.json alone."""

import pytest
from transformers import LlamaConfig

from laptrain.commands.cli import main
from laptrain.families.lora.sizing import LLAMA32_3B


@pytest.fixture(scope="module")
def llama_3b_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama32_3b")
    LlamaConfig(**LLAMA32_3B).save_pretrained(folder)  # config.json only: no weights anywhere
    return folder


def test_llama_3b_estimate_from_a_local_config(capsys, llama_3b_folder):
    code = main(
        [
            "preflight",
            "model=llama32_3b_lora",
            "hardware=m2_air",
            "hardware.memory_budget_gb=16",
            f"model.pretrained={llama_3b_folder}",
            "data=instructions",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "parameters: 3.21 B base" in out and "LoRA r 16, targets all-linear" in out
    assert "base weights: fp32 11.97 GiB (12.85 GB) / bf16 5.98 GiB (6.43 GB)" in out
    assert "base dtype: bfloat16 (base_dtype auto" in out
    assert "logits B·S·V = 1·512·128256" in out
    assert "estimate (fp32 base): " in out and "estimate (bf16 base): " in out
    assert "budget: 16.00 GiB from hardware.memory_budget_gb=16" in out
    assert "\nfits: " in out


def test_a_job_that_does_not_fit_lists_the_fixes(capsys, llama_3b_folder):
    code = main(
        [
            "preflight",
            "model=llama32_3b_lora",
            "hardware=m2_air",
            "hardware.memory_budget_gb=8",
            f"model.pretrained={llama_3b_folder}",
            "model.base_dtype=float32",
            "data=instructions",
            "data.max_length=2048",
        ]
    )
    out = capsys.readouterr().out
    from laptrain.exit_codes import DOES_NOT_FIT_EXIT

    assert code == DOES_NOT_FIT_EXIT  # as train.py's refusal, bench and doctor
    assert "\ndoes not fit: " in out
    assert "data.max_length=1024" in out and "model.base_dtype=bfloat16" in out
    assert "model.lora.r=8" in out


def test_an_apple_profile_on_this_linux_box_needs_a_budget(capsys, llama_3b_folder):
    code = main(
        [
            "preflight",
            "model=llama32_3b_lora",
            "hardware=m2_air",
            f"model.pretrained={llama_3b_folder}",
        ]
    )
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    (line,) = captured.err.strip().splitlines()
    assert "hardware=m2_air is for a Mac" in line and "hardware.memory_budget_gb=<GiB>" in line


def test_classifier_models_are_left_to_the_training_preflight(capsys):
    assert main(["preflight", "model=tiny_classifier", "hardware=cpu"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "estimates from the config only the lora family" in line


def test_json_is_one_document_with_the_verdict_the_numbers_and_the_fixes(capsys, llama_3b_folder):
    """``laptrain preflight --json`` (as ``doctor --json``): nothing but the document on stdout."""
    import json

    from laptrain.exit_codes import DOES_NOT_FIT_EXIT

    argv = ["preflight", "model=llama32_3b_lora", "--json", "hardware=m2_air"]
    argv += ["hardware.memory_budget_gb=8", f"model.pretrained={llama_3b_folder}"]
    argv += ["model.base_dtype=float32", "data=instructions", "data.max_length=2048"]
    assert main(argv) == DOES_NOT_FIT_EXIT
    found = json.loads(capsys.readouterr().out)
    assert set(found) == {
        "fits",
        "exit_code",
        "estimate_gib",
        "budget_gib",
        "budget_source",
        "fixes",
        "lines",
    }
    assert found["fits"] is False and found["exit_code"] == DOES_NOT_FIT_EXIT
    assert found["budget_gib"] == 8.0 and found["estimate_gib"] > 8.0
    assert found["budget_source"].startswith("hardware.memory_budget_gb=8")
    assert any("model.lora.r=8" in fix for fix in found["fixes"])
    assert any(line.startswith("does not fit: ") for line in found["lines"])
