"""`laptrain export` refuses a family's own option with a format that family does not serve,
instead of ignoring it (LoRA's --fuse/--device/--dtype with --format onnx)."""

from __future__ import annotations

from pathlib import Path

import pytest

from laptrain.commands import cli


def _run(tmp_path: Path, target: str) -> Path:
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text(f"model:\n  _target_: {target}\n")
    return run


@pytest.mark.parametrize(
    ("target", "option"),
    [
        ("mytask.module.LitClassifier", ["--fuse"]),  # a user's module: the generic onnx export
        ("laptrain.families.classifier.text_classifier.TextClassifierModule", ["--device", "cpu"]),
        ("laptrain.families.lora.causal_lm.CausalLMLoRAModule", ["--dtype", "bfloat16"]),
    ],
)
def test_a_lora_option_with_format_onnx_is_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, option: list[str]
) -> None:
    run = _run(tmp_path, target)
    code = cli.main(["export", str(run), "--format", "onnx", *option])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"error: {option[0]} is for --format hf, gguf, mlx, not onnx")
    assert err.endswith(f"drop {option[0]}") and "\n" not in err
    assert sorted(p.name for p in run.iterdir()) == [".hydra"]
