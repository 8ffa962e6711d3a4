"""`laptrain export RUN --format mlx [--fuse] [--quant 4bit|8bit]` (issue 49, items 1, 4, 5): the
adapter read by mlx-lm itself (`mlx_lm.load(base, adapter_path=...)`) and the fused folder
(`mlx_lm.load(DIR)`) give the logits of the torch model merged by peft (float32, within 1e-3),
greedy generation is the same text, a DPO run trained through train.py exports the same way, and
every refusal is one line, exit 2, nothing written. Needs the mlx extra (skipped without it),
but for the test of its absence. benchmarks/mlx_export.py checks the real SmolLM2 preset."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch

from laptrain.commands.cli import main
from laptrain.families.lora.causal_lm import CausalLMLoRAModule
from laptrain.families.lora.instructions import render_prompt
from laptrain.families.lora.tools import load_adapter_model
from tests.test_causal_lm_lora import (
    PAIRS,
    _one_thread,  # noqa: F401 - module fixture
    save_base,
    tokenizer,  # noqa: F401 - module fixture
)

needs_mlx = pytest.mark.skipif(
    importlib.util.find_spec("mlx_lm") is None,
    reason='mlx-lm is not installed: pip install -e ".[mlx]"',
)
PROBES = ["Serialize obj to a JSON formatted str.", "Return the square root of x.", "Copy data."]


def write_adapter(run: Path, base: str, tok, seed: int = 0, **lora) -> Path:
    """A LoRA module's adapter folder (``run/adapter``) with random, non-zero A and B."""
    module = CausalLMLoRAModule(tok, pretrained=base, lora={"r": 4, "alpha": 8, **lora})
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in module.model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.3)
    module.export(run / "adapter")
    return run


@pytest.fixture(scope="module")
def calm_base(tokenizer, tmp_path_factory):  # noqa: F811
    """A tiny Llama folder with its tokenizer, as laptrain's offline base is saved; Llama's usual
    initializer_range 0.02 (at 0.3 float32 rounding alone moves logits by ~1e-4), and SmolLM2's
    rope_theta, 100000, which transformers 5 writes inside rope_parameters."""
    folder = tmp_path_factory.mktemp("base")
    save_base(tokenizer, folder, initializer_range=0.02)
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"]["rope_theta"] = 100000.0
    (folder / "config.json").write_text(json.dumps(config))
    tokenizer.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def run(tokenizer, calm_base, tmp_path_factory):  # noqa: F811
    return write_adapter(tmp_path_factory.mktemp("run"), calm_base, tokenizer)


@pytest.fixture(scope="module")
def merged(run):
    """The reference: the adapter merged into its base by peft, in float32."""
    return load_adapter_model(run / "adapter").merge_and_unload().eval()


def _refused(capsys, args: list[str], *words: str) -> str:
    assert main(args) == 2
    captured = capsys.readouterr()
    message = captured.err.strip()
    assert message.startswith("error: ") and "\n" not in message, captured.err
    for word in words:
        assert word in message, message
    return message


def _mlx_logits(model, ids: list[int]):
    import mlx.core as mx
    import numpy as np

    return torch.from_numpy(np.array(model(mx.array([ids])).astype(mx.float32)))


def _torch_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits.float()


def _export(capsys, *args: str) -> str:
    assert main(["export", *args]) == 0
    return capsys.readouterr().out


def _worst_gap(mlx_model, torch_model, tok) -> float:
    """The largest |logit difference| over the probe texts."""
    worst = 0.0
    for text in PROBES:
        ids = tok(text).input_ids
        gap = _mlx_logits(mlx_model, ids) - _torch_logits(torch_model, ids)
        worst = max(worst, gap.abs().max().item())
    return worst


@needs_mlx
def test_mlx_lm_reads_the_adapter_and_the_fused_model_as_the_merged_torch_model(
    run,
    merged,
    tokenizer,  # noqa: F811
    calm_base,  # noqa: F811
    capsys,
):
    from mlx_lm import load

    assert main(["export", str(run), "--format", "mlx"]) == 0
    out, err = capsys.readouterr()
    assert "model_config={'rope_theta': 100000.0}" in err  # mlx-lm ignores rope_parameters
    assert f"MLX adapter (rank 4, scale 2, 2 layers) written to {run / 'mlx'}" in out
    assert f"--adapter-path {run / 'mlx'}" in out
    config = json.loads((run / "mlx" / "adapter_config.json").read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == 2
    assert config["lora_parameters"]["keys"] == [
        "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj",
        "self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj", "self_attn.v_proj",
    ]  # fmt: skip
    out = _export(capsys, str(run), "--format", "mlx", "--fuse")
    assert f"MLX model (float32) written to {run / 'mlx-fused'}" in out

    rope = {"rope_theta": 100000.0}  # as the export's note says: mlx-lm reads it at the top
    with_adapter, _ = load(calm_base, adapter_path=str(run / "mlx"), model_config=rope)
    fused, mlx_tokenizer = load(str(run / "mlx-fused"))
    assert _worst_gap(with_adapter, merged, tokenizer) <= 1e-3
    assert _worst_gap(fused, merged, tokenizer) <= 1e-3
    base_alone, _ = load(calm_base, model_config=rope)
    assert _worst_gap(base_alone, merged, tokenizer) > 0.1  # the adapter does change the logits
    # the fused folder carries the run's tokenizer and chat template
    messages = [{"role": "user", "content": PAIRS[0][0]}]
    assert mlx_tokenizer.apply_chat_template(messages, add_generation_prompt=True) == (
        render_prompt(tokenizer, PAIRS[0][0])
    )


@needs_mlx
def test_an_rslora_adapter_keeps_its_scale(tokenizer, calm_base, tmp_path, capsys):  # noqa: F811
    """use_rslora: peft scales by alpha / sqrt(r), which mlx-lm's `scale` then carries (4 / 2)."""
    from mlx_lm import load

    rslora = write_adapter(tmp_path, calm_base, tokenizer, seed=1, use_rslora=True)
    out = _export(capsys, str(rslora), "--format", "mlx")
    assert "scale 4," in out
    merged = load_adapter_model(rslora / "adapter").merge_and_unload().eval()
    model, _ = load(calm_base, adapter_path=str(rslora / "mlx"), model_config={"rope_theta": 1e5})
    assert _worst_gap(model, merged, tokenizer) <= 1e-3


@needs_mlx
def test_greedy_generation_in_mlx_lm_is_the_merged_model_s(run, merged, tokenizer, capsys):  # noqa: F811
    """The same 12 tokens (so the same text) from mlx-lm's generation loop as from transformers'."""
    from mlx_lm import load, stream_generate

    _export(capsys, str(run), "--format", "mlx", "--fuse", "--out", str(run / "gen"))
    fused, mlx_tokenizer = load(str(run / "gen"))
    mlx_tokenizer._eos_token_ids = set()  # 12 tokens whatever they are, as torch makes them
    for prompt, _ in PAIRS[:3]:
        ids = render_prompt(tokenizer, prompt)
        with torch.no_grad():
            done = merged.generate(
                torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None
            )
        ours = [r.token for r in stream_generate(fused, mlx_tokenizer, ids, max_tokens=12)]
        assert ours == done[0, len(ids) :].tolist()


@needs_mlx
def test_quant_uses_mlx_lm_s_quantizer(run, merged, tokenizer, capsys):  # noqa: F811
    """4bit and 8bit: mlx-lm's affine quantizer (group 64), 8-bit ~16x closer to float32."""
    from mlx_lm import load

    gaps = {}
    for quant, bits in (("8bit", 8), ("4bit", 4)):
        out = _export(capsys, str(run), "--format", "mlx", "--fuse", "--quant", quant)
        folder = run / f"mlx-fused-{quant}"
        assert f"MLX model ({bits}-bit, " in out and str(folder) in out
        config = json.loads((folder / "config.json").read_text())
        assert config["quantization"] == {"group_size": 64, "bits": bits, "mode": "affine"}
        quantized, _ = load(str(folder))
        assert type(quantized.model.layers[0].mlp.down_proj).__name__ == "QuantizedLinear"
        gaps[quant] = _worst_gap(quantized, merged, tokenizer)
    assert 0 < gaps["8bit"] < gaps["4bit"] / 4, gaps  # measured 0.071 and 0.92


@needs_mlx
def test_a_dpo_run_exports_the_same_way(tmp_path, capsys):
    from mlx_lm import load

    from tests.in_process import train_here
    from tests.test_dpo import DPO_JOB

    done = train_here([*DPO_JOB, "run_name=d"], tmp_path, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    dpo = tmp_path / "outputs" / "d"
    _export(capsys, str(dpo), "--format", "mlx", "--fuse")
    merged = load_adapter_model(dpo / "adapter").merge_and_unload().eval()
    fused, mlx_tokenizer = load(str(dpo / "mlx-fused"))
    assert _worst_gap(fused, merged, mlx_tokenizer._tokenizer) <= 1e-3


@needs_mlx
def test_a_run_still_training_exports_its_newest_step_adapter_and_says_so(run, tmp_path, capsys):
    training = tmp_path / "training"
    shutil.copytree(run / "adapter", training / "adapters" / "step-000004")
    (training / ".hydra").mkdir()
    (training / ".hydra" / "config.yaml").write_text(
        "model:\n  _target_: laptrain.families.lora.causal_lm.CausalLMLoRAModule\n"
    )
    assert main(["export", str(training), "--format", "mlx"]) == 0
    captured = capsys.readouterr()
    assert "no adapter/ yet" in captured.err and "step-000004" in captured.err
    assert (training / "step-000004-mlx" / "adapters.safetensors").is_file()


# ----- bad input: one line, exit 2, nothing written -------------------------------------------
def test_without_the_extra_the_line_names_the_install(run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "mlx_lm", None)  # import fails as when not installed
    _refused(capsys, ["export", str(run), "--format", "mlx"], 'pip install -e ".[mlx]"')
    assert not (run / "mlx-x").exists()


def test_quant_choices_belong_to_their_format(run, capsys):
    _refused(capsys, ["export", str(run), "--format", "mlx", "--fuse", "--quant", "q4_0"], "4bit")
    _refused(capsys, ["export", str(run), "--format", "mlx", "--quant", "4bit"], "--fuse")
    _refused(capsys, ["export", str(run), "--format", "gguf", "--quant", "4bit"], "q8_0")
    _refused(capsys, ["export", str(run), "--fuse"], "--format mlx")
    assert not [p for p in run.iterdir() if p.name.startswith(("mlx-fused-q", "gguf-4"))]


def test_a_classifier_run_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(
        "model:\n  _target_: laptrain.families.classifier.module.TextClassifier\n"
    )
    _refused(capsys, ["export", str(run), "--format", "mlx"], "TextClassifier", "LoRA")
    assert sorted(p.name for p in run.iterdir()) == [".hydra"]


@needs_mlx
def test_a_folder_laptrain_did_not_write_is_kept_without_force(run, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    _refused(capsys, ["export", str(run), "--format", "mlx", "--out", str(mine)], "--force")
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    _export(capsys, str(run), "--format", "mlx", "--out", str(mine), "--force")
    assert (mine / "adapters.safetensors").is_file() and not (mine / "notes.txt").exists()


@needs_mlx
def test_what_mlx_lm_cannot_express_is_refused(run, tmp_path, calm_base, capsys):  # noqa: F811
    dora = tmp_path / "dora"
    shutil.copytree(run / "adapter", dora)
    config = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**config, "use_dora": True}))
    _refused(capsys, ["export", str(dora), "--format", "mlx"], "DoRA")

    other = tmp_path / "other-base"
    shutil.copytree(calm_base, other)
    base_config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**base_config, "model_type": "made_up"}))
    moved = tmp_path / "moved"
    shutil.copytree(run / "adapter", moved)
    (moved / "adapter_config.json").write_text(
        json.dumps({**config, "base_model_name_or_path": str(other)})
    )
    _refused(capsys, ["export", str(moved), "--format", "mlx"], "made_up", "mlx-lm")
    assert not (tmp_path / "dora-mlx").exists() and not (tmp_path / "moved-mlx").exists()
