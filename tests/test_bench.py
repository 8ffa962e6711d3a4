"""laptrain bench: the report and advice of a user's job, and --compare, on a tiny job."""

from __future__ import annotations

from pathlib import Path

import pytest

from laptrain.commands import cli
from laptrain.commands.bench import StepStats, advice, parse_compare
from tests.conftest import TINY, write_texts


@pytest.fixture
def job_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setenv("LAPTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    csv = write_texts(tmp_path / "texts.csv", rows=120)
    return [*TINY, "data=text_csv", f"data.files.train={csv}", "hardware=cpu"]


def test_report_of_a_tiny_job_and_no_run_folder(job_args, tmp_path, capsys) -> None:
    assert cli.main(["bench", "--steps", "4", "--warmup", "1", *job_args]) == 0
    out = capsys.readouterr().out
    for line in ("samples/s:", "tokens/s:", "step time:", "between batches:", "peak memory:"):
        assert line in out
    assert "CPU utilisation:" in out and "advice" in out
    assert "(4 timed steps, cpu" in out
    samples = float(out.split("samples/s:")[1].split()[0])
    assert samples > 0
    assert not (tmp_path / "outputs").exists()  # nothing written where a run would go


def test_compare_runs_both_settings_and_prints_the_ratio(job_args, capsys) -> None:
    argv = ["--steps", "4", "--warmup", "1", "--rounds", "2"]
    argv += ["--compare", "data.group_by_length=false,true"]
    assert cli.main(["bench", *argv, *job_args]) == 0
    out = capsys.readouterr().out
    assert "data.group_by_length=false" in out and "data.group_by_length=true" in out
    ratio = out.split("samples/s ratio ")[1].split(",")[0]
    assert float(ratio) > 0


def test_bad_input_is_one_line_and_exit_2(job_args, capsys) -> None:
    assert cli.main(["bench", "--compare", "hardware.num_workers=0", *job_args]) == 2
    assert "expected key=a,b" in capsys.readouterr().err
    with pytest.raises(ValueError, match="key=a,b"):
        parse_compare("=1,2")


def stats(**kw) -> StepStats:
    base = dict(step_s=[0.1] * 10, data_s=[0.0] * 10, samples=160, wall_s=1.0, cpu_s=1.9)
    base.update(threads=2, real_tokens=900, computed_tokens=1000, rss_peak_bytes=1 << 30)
    base.update(ram_total_bytes=16 << 30)
    base.update(kw)
    return StepStats(**base)


def test_advice_names_the_setting_for_each_bottleneck() -> None:
    assert advice(stats()) == []
    data = advice(stats(data_s=[0.05] * 10))
    assert len(data) == 1 and "hardware.num_workers=2" in data[0]
    assert "persistent_workers" in advice(stats(data_s=[0.05] * 10, workers=2))[0]
    memory = advice(stats(rss_peak_bytes=15 << 30))
    assert len(memory) == 1 and "hardware.batch_size" in memory[0]
    assert "gradient_checkpointing" in memory[0]
    cpu = advice(stats(cpu_s=0.5))
    assert len(cpu) == 1 and cpu[0].startswith("CPU underused")
    padding = advice(stats(real_tokens=400, grouped=False))
    assert len(padding) == 1 and "data.group_by_length=true" in padding[0]
    assert "max_length" in advice(stats(real_tokens=400, grouped=True))[0]


def test_token_counts_of_padded_and_packed_batches():
    """A packed batch's 4-D additive mask sums to -inf: its real tokens come from the labels
    (each row up to its last labelled position), as the run report counts them."""
    import torch

    from laptrain.commands.bench import _batch_tokens

    ids = torch.ones(2, 5, dtype=torch.long)
    padded = {"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1] * 5])}
    assert _batch_tokens(padded) == (8, 10)
    packed_mask = torch.zeros(2, 1, 5, 5)
    packed_mask[0, 0, 0, 1] = float("-inf")
    labels = torch.tensor([[-100, 3, 4, -100, -100], [-100, -100, 1, 2, 3]])
    assert _batch_tokens({"input_ids": ids, "attention_mask": packed_mask, "labels": labels}) == (
        8,
        10,
    )
    assert _batch_tokens({"pixels": torch.ones(2)}) == (0, 0)


def test_memory_advice_names_the_checkpointing_key_the_model_has() -> None:
    """TRM presets refuse model.gradient_checkpointing: the advice names their grad_checkpoint,
    and names none for a model with neither (a user's own module)."""
    from hydra import compose, initialize_config_dir

    from laptrain.commands.bench import checkpointing_key
    from tests.conftest import ROOT

    conf = ROOT / "conf"
    with initialize_config_dir(str(conf), version_base="1.3"):  # as the job composes each preset
        keys = {
            p.stem: checkpointing_key(compose("train", [f"model={p.stem}"]).model)
            for p in (conf / "model").glob("*.yaml")
        }
    assert keys["trm_sudoku"] == "model.grad_checkpoint"
    assert keys["tiny_classifier"] == keys["tiny_llama_lora"] == "model.gradient_checkpointing"
    assert all(keys.values()), keys  # every preset has one of the two
    trm = advice(stats(rss_peak_bytes=15 << 30, checkpointing="model.grad_checkpoint"))
    assert len(trm) == 1 and "set model.grad_checkpoint=true" in trm[0]
    assert "gradient_checkpointing" not in trm[0]
    none = advice(stats(rss_peak_bytes=15 << 30, checkpointing=None))
    assert none[0].endswith("(accumulation keeps the effective batch)")
