"""laptrain export / generate / eval, and memorisation end to end (issue 12, items 2 and 8); the
run's device and base dtype, overrides and the memory check (issue 24, item 10)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laptrain.commands.cli import main
from laptrain.console import no_transformers_bars
from laptrain.families.lora.causal_lm import CausalLMLoRAModule
from laptrain.families.lora.instructions import render_prompt
from laptrain.families.lora.tools import (
    BaseSize,
    BaseTooLarge,
    LoadPlan,
    RunRecord,
    check_memory,
    evaluate,
    export_merged,
    find_adapter,
    generate,
    load_for_generation,
    plan_load,
)
from laptrain.hardware.probe import MemoryReading
from tests.fakes import FakeProbe
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


# ----- issue 24 item 10: the run's device and base dtype, and the memory check ----------------
GiB = 1024**3


def recorded_run(trained_run, folder, device="mps", base_dtype="bfloat16", quantization=None):
    """A copy of the trained run whose records say it trained on ``device`` with a
    ``base_dtype`` (``quantization``) base: run_info.json's plan and training_config.json."""
    source, _ = trained_run
    run = folder / "run"
    shutil.copytree(source / "adapter", run / "adapter")
    config_path = run / "adapter" / "training_config.json"
    config = json.loads(config_path.read_text())
    config["hparams"].update(base_dtype=base_dtype, quantization=quantization)
    config.pop("device", None)  # the adapter's own record; run_info.json's plan says it here
    config_path.write_text(json.dumps(config))
    (run / "run_info.json").write_text(json.dumps({"plan": {"device": device, "profile": "x"}}))
    return run


def probes(available=("cpu",), free_gib=64.0, bf16=True):
    """A stand-in for TorchProbe: ``available`` kinds exist, each with ``free_gib`` of memory."""
    gib = int(free_gib * GiB)
    reading = MemoryReading(
        rss=0,
        system_total=gib,
        system_available=gib,
        system_percent=0.0,
        swap_used=0,
        device_limit=gib,
        device_free=gib,
    )

    def make(kind):
        return FakeProbe(
            kind=kind, is_available=kind in available, has_bf16=bf16, readings=[reading]
        )

    return make


class Stop(Exception):
    """Raised by the stubbed loader once it has its arguments."""


@pytest.fixture
def loads(monkeypatch):
    """Every ``AutoModelForCausalLM.from_pretrained`` call's keyword arguments; the load itself
    runs on the CPU (this machine has no MPS or GPU), or raises Stop with ``loads.stop = True``."""
    real = AutoModelForCausalLM.from_pretrained
    calls = []

    def fake(name, **kwargs):
        calls.append(kwargs)
        if fake.stop:
            raise Stop
        return real(name, **{k: v for k, v in kwargs.items() if k != "device_map"})

    fake.calls, fake.stop = calls, False
    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", fake)
    return fake


def _pairs_file(folder):
    data = folder / "pairs.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "response": r}) + "\n" for p, r in PAIRS))
    return data


@pytest.mark.parametrize("tool", ["generate", "eval", "export"])
def test_a_run_recorded_on_mps_in_bfloat16_loads_on_mps_in_bfloat16(
    trained_run, tmp_path, loads, capsys, tool
):
    run = recorded_run(trained_run, tmp_path, "mps", "bfloat16")
    loads.stop = True
    on_a_mac = probes(available=("cpu", "mps"))
    with pytest.raises(Stop):
        if tool == "generate":
            load_for_generation(run, probe=on_a_mac)
        elif tool == "eval":
            evaluate(run, _pairs_file(tmp_path), probe=on_a_mac)
        else:
            export_merged(run, tmp_path / "merged", probe=on_a_mac)
    [kwargs] = loads.calls
    assert kwargs["device_map"] == "mps" and kwargs["dtype"] is torch.bfloat16
    assert capsys.readouterr().err == ""  # no fallback: loaded as the run trained
    assert not (tmp_path / "merged").exists() and not (tmp_path / ".merged.partial").exists()


def test_a_device_this_machine_lacks_falls_back_to_cpu_with_one_line(trained_run, tmp_path, capsys):
    run = recorded_run(trained_run, tmp_path, "mps", "bfloat16")
    with no_transformers_bars():  # as the CLI runs it
        model, _ = load_for_generation(run, probe=probes(available=("cpu",)))
    assert model.device.type == "cpu"
    frozen = {p.dtype for n, p in model.named_parameters() if "lora_" not in n}
    assert frozen == {torch.bfloat16}  # the CPU computes in bfloat16: the run's dtype stays
    err = capsys.readouterr().err.strip()
    assert err == "the run trained on mps, which this machine cannot use: loading on cpu"


def test_export_refuses_a_base_over_the_budget_with_the_does_not_fit_exit_and_writes_nothing(
    trained_run, tmp_path, loads, monkeypatch, capsys
):
    from laptrain.families.lora import tools as lora_tools

    run = recorded_run(trained_run, tmp_path, "cpu", "float32")
    size = lora_tools.base_size(lora_tools.base_name_of(run / "adapter"), "")
    fp32, bf16 = (size.params * width * 1.1 + lora_tools.LOAD_HEADROOM for width in (4, 2))
    budget = (fp32 + bf16) / 2  # the cpu profile's 0.8 x available RAM: bfloat16 fits, float32 not
    monkeypatch.setattr(lora_tools, "TorchProbe", probes(free_gib=budget / 0.8 / GiB))
    before = sorted(p.name for p in tmp_path.iterdir())
    from laptrain.exit_codes import DOES_NOT_FIT_EXIT

    assert main(["export", str(run), "--out", str(tmp_path / "merged")]) == DOES_NOT_FIT_EXIT
    message = capsys.readouterr().err.strip()
    assert "\n" not in message and message.startswith("error: the base does not fit")
    assert "float32 on cpu" in message and "budget" in message and "--dtype bfloat16" in message
    assert loads.calls == []  # refused before any weight was read
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no merged/, no .partial
    assert not (run / "merged").exists()


def test_the_memory_check_refuses_a_3b_float32_base_on_a_16gb_mac_and_passes_bfloat16():
    """The issue's case: Llama 3.2 3B (config.json counts) under m2_air's rule on 16 GB."""
    size = BaseSize(params=3_212_749_824, embedding=128256 * 3072, vocab=128256)
    mac = FakeProbe(
        kind="mps",
        readings=[
            MemoryReading(
                rss=0,
                system_total=16 * GiB,
                system_available=11 * GiB,
                system_percent=30.0,
                swap_used=0,
                device_limit=12 * GiB,  # torch.mps.recommended_max_memory, ~75 % of RAM
            )
        ],
    )
    record = RunRecord(device="mps", base_dtype="float32", hardware={"memory_fraction": 0.65})
    with pytest.raises(BaseTooLarge) as err:
        check_memory(LoadPlan("mps", torch.float32), mac, record, size)
    text = str(err.value)
    assert "3.21 B parameters in float32 on mps need 13.42 GiB" in text
    assert "over the 7.80 GiB budget (0.65 x MPS recommended max" in text
    assert "--dtype bfloat16 (needs 6.83 GiB)" in text and "\n" not in text
    check_memory(LoadPlan("mps", torch.bfloat16), mac, record, size)  # 6.83 GiB: fits


def test_dtype_and_device_override_the_run_and_export_writes_the_dtype(
    trained_run, tmp_path, loads, monkeypatch, capsys
):
    from safetensors import safe_open

    from laptrain.families.lora import tools as lora_tools

    def written(folder):
        with safe_open(str(folder / "model.safetensors"), "pt") as f:
            return {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118

    run = recorded_run(trained_run, tmp_path, "cpu", "bfloat16")
    assert main(["export", str(run), "--out", str(tmp_path / "bf16")]) == 0  # the run's dtype
    assert written(tmp_path / "bf16") == {"BF16"}
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert main(["export", str(run), "--out", str(tmp_path / "fp32"), "--dtype", "float32"]) == 0
    assert written(tmp_path / "fp32") == {"F32"}
    assert [c["dtype"] for c in loads.calls] == [torch.bfloat16, torch.float32]

    data = _pairs_file(tmp_path)
    assert main(["eval", str(run), "--data", str(data), "--dtype", "float32"]) == 0
    assert loads.calls[-1]["dtype"] is torch.float32

    mac_run = recorded_run(trained_run, tmp_path / "mac", "mps", "bfloat16")
    monkeypatch.setattr(lora_tools, "TorchProbe", probes(available=("cpu", "mps")))
    capsys.readouterr()
    argv = ["generate", str(mac_run), "--prompt", PAIRS[0][0], "--max-new-tokens", "3"]
    assert main([*argv, "--device", "cpu", "--dtype", "float32"]) == 0
    assert loads.calls[-1] == {"dtype": torch.float32}  # no device_map: the CPU, as today
    assert capsys.readouterr().err == ""


def test_4bit_runs_reload_4bit_on_cuda_and_fall_back_elsewhere_with_one_line(monkeypatch, capsys):
    from laptrain.families.lora import tools as lora_tools

    monkeypatch.setattr(lora_tools, "_has_bitsandbytes", lambda: True)
    record = RunRecord(device="cuda", base_dtype="bfloat16", quantization="4bit")
    gpu = probes(available=("cpu", "cuda"))
    plan, _ = plan_load(record, probe=gpu)
    assert plan == LoadPlan("cuda", torch.bfloat16, "4bit") and capsys.readouterr().err == ""
    plan, _ = plan_load(record, probe=gpu, quantized=False)  # export: an unquantized merge
    assert plan == LoadPlan("cuda", torch.bfloat16)
    assert capsys.readouterr().err.count("\n") == 1
    plan, _ = plan_load(record, probe=probes(available=("cpu",), bf16=False))
    assert plan == LoadPlan("cpu", torch.float32)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == "the run trained on cuda, which this machine cannot use: loading on cpu"
    assert lines[1].startswith("the run's base was 4-bit") and lines[1].endswith("float32 on cpu")
