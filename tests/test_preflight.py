import json
from dataclasses import replace

import pytest
import torch
from transformers import BertForSequenceClassification

from laptrain.families.classifier.tiny_bert import tiny_bert_classifier
from laptrain.hardware.probe import MemoryReading
from laptrain.launch.device import RunDevice
from laptrain.preflight.activations import (
    Quadratic,
    hf_batch_maker,
    hf_loss,
    measure_activations,
    measure_once,
    repeated_blocks,
)
from laptrain.preflight.batch import PreflightError, plan_batch
from laptrain.preflight.budget import device_budget
from laptrain.preflight.estimate import GiB, model_memory
from laptrain.preflight.request import PlanRequest, choose_micro_batch
from tests.fakes import FakeProbe
from tests.test_plan import launched

SEQ = 64


def tiny_bert() -> BertForSequenceClassification:
    torch.manual_seed(0)
    return tiny_bert_classifier(vocab_size=100, num_hidden_layers=2, max_position_embeddings=128)


def reading(**kw) -> MemoryReading:
    base = dict(
        rss=0, system_total=16 * GiB, system_available=8 * GiB, system_percent=50.0, swap_used=0
    )
    return MemoryReading(**{**base, **kw})


CPU = RunDevice("cpu", "32-true", None, ())


def cpu_profile(budget_gb: float, batch_size: int | str = "auto", **kw) -> PlanRequest:
    fixed = {} if batch_size == "auto" else {"auto": False, "size": batch_size}
    return PlanRequest(memory_budget_gb=budget_gb, **fixed, **kw)


def test_quadratic_through_three_points_is_exact():
    q = Quadratic.through([(10, 1 + 20 + 300), (20, 1 + 40 + 1200), (30, 1 + 60 + 2700)])
    assert q(100) == pytest.approx(1 + 200 + 30000)


def test_activations_fitted_at_short_lengths_match_a_direct_measurement_at_full_length():
    model = tiny_bert()
    profile = measure_activations(model, SEQ)
    direct = measure_once(
        model, hf_batch_maker(model)(3, 128), hf_loss, "32-true", repeated_blocks(model)
    )
    measured = direct.outside + sum(direct.by_block)
    assert profile.fixed + 3 * profile.total(128) == pytest.approx(measured, rel=0.01)
    assert profile.total.b > 0  # attention's seq² term is seen


def test_measuring_leaves_no_graph_alive_after_it():
    """The measured forwards' graphs are freed: a pack hook that returned the saved tensor itself
    kept each graph alive through a cycle (saved output -> its grad_fn -> the saved output) that
    Python's collector cannot break, and SmolLM2's runs carried 0.42 GiB of them into training."""
    import gc

    def graph_tensors() -> int:
        gc.collect()
        return sum(isinstance(o, torch.Tensor) and o.grad_fn is not None for o in gc.get_objects())

    model = tiny_bert()
    before = graph_tensors()
    measure_activations(model, SEQ)
    assert graph_tensors() == before


def test_auto_picks_the_largest_batch_within_a_tiny_budget():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    budget = memory.estimate(10, SEQ, "cpu", 0).total + 1
    plan = plan_batch(model, SEQ, cpu_profile(budget / GiB), FakeProbe(readings=[reading()]))
    assert plan.micro_batch == 10
    assert plan.estimate.total <= plan.budget.bytes
    assert memory.estimate(11, SEQ, "cpu", 0).total > plan.budget.bytes


def test_fsdp_divides_weights_grads_and_optimizer_state_by_the_ranks():
    memory = model_memory(tiny_bert(), SEQ, "32-true")
    whole = memory.estimate(4, SEQ, "cuda", 0)
    quarter = memory.estimate(4, SEQ, "cuda", 0, shards=4)
    for part in ("weights", "grads", "optimizer"):
        assert getattr(quarter, part) == pytest.approx(getattr(whole, part) / 4)
    assert quarter.activations == whole.activations  # each rank still runs its own micro batch


def test_the_plan_asks_the_preflight_for_fsdp_shards_only_under_fsdp(tmp_path):
    from tests.conftest import compose_train

    seen = []

    def preflight(model, datamodule, request, device, *dirs):
        seen.append(request.shards)

    from laptrain.job.plan import build_run_plan

    for strategy, shards in (("fsdp", 4), ("ddp", 1)):
        cfg = compose_train(
            [
                "hardware=cpu",
                "hardware.batch_size=4",
                f"trainer.strategy={strategy}",
                "trainer.devices=2",
                "+trainer.num_nodes=2",
            ],
            tmp_path,
        )
        build_run_plan(
            cfg, tiny_bert(), _Data(), launched(cfg), tmp_path, tmp_path, preflight=preflight
        )
        assert seen[-1] == shards


def test_auto_keeps_the_effective_batch_through_accumulation():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    budget = memory.estimate(10, SEQ, "cpu", 0).total + 1
    plan = plan_batch(
        model, SEQ, cpu_profile(budget / GiB, effective_batch=64), FakeProbe(readings=[reading()])
    )
    assert (plan.micro_batch, plan.accumulation, plan.effective_batch) == (8, 8, 64)
    assert "micro batch 8 x accumulation 8 x devices 1 = effective batch 64" in "\n".join(
        plan.summary_lines()
    )


def test_alignment_rounds_down_to_a_multiple_of_8_and_prefers_aligned_divisors():
    assert choose_micro_batch(23, None, 8) == (16, 1)
    assert choose_micro_batch(5, None, 8) == (5, 1)  # below 8: nothing to align to
    assert choose_micro_batch(30, 48, 8) == (24, 2)
    assert choose_micro_batch(30, 48, 1) == (24, 2)
    assert choose_micro_batch(30, 100, 8) == (25, 4)  # exact effective batch wins over alignment


def test_cuda_profile_plans_against_free_gpu_memory_with_alignment():
    model = tiny_bert()
    probe = FakeProbe(kind="cuda", readings=[reading(device_limit=8 * GiB, device_free=1 * GiB)])
    profile = cpu_profile(None, multiple=8, max_batch=100)
    plan = plan_batch(model, SEQ, profile, probe, "16-mixed")
    assert plan.budget.source == "0.8 x free GPU memory 1.0 GiB"
    assert plan.micro_batch == 96 and plan.micro_batch % 8 == 0


def test_mps_budget_is_a_fraction_of_recommended_max_capped_by_available_ram():
    roomy = FakeProbe(
        kind="mps", readings=[reading(device_limit=12 * GiB, system_available=20 * GiB)]
    )
    assert device_budget(roomy, 0.8).bytes == pytest.approx(0.8 * 12 * GiB)
    busy = FakeProbe(
        kind="mps", readings=[reading(device_limit=12 * GiB, system_available=4 * GiB)]
    )
    budget = device_budget(busy, 0.8)
    assert budget.bytes == 4 * GiB and budget.source.startswith("available RAM 4.0 GiB")
    assert device_budget(busy, 0.8, memory_budget_gb=2).bytes == 2 * GiB


def test_a_job_that_cannot_fit_is_refused_with_fixes_ordered_by_effect():
    model = tiny_bert()
    with pytest.raises(PreflightError) as err:
        plan_batch(model, SEQ, cpu_profile(0.0001), FakeProbe(readings=[reading()]))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith("this job does not fit even at micro batch 1")
    fixes = message.split("Fixes, largest first: ")[1].split("; ")
    names = " ".join(fixes)
    for fix in ("data.max_length=32", "activation_checkpointing_enable", "bf16-mixed", "smaller"):
        assert fix in names
    assert fixes[-1].startswith("none alone is enough")  # 0.0001 GiB is below any job
    savings = [float(f.split(" saves ")[1].split(" GiB")[0]) for f in fixes[:-1]]
    assert savings == sorted(savings, reverse=True)


def test_a_fixed_batch_that_does_not_fit_names_the_option():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    budget = memory.estimate(4, SEQ, "cpu", 0).total + 1
    with pytest.raises(
        PreflightError, match=r"hardware.batch_size=16 does not fit.*largest that fits is 4"
    ):
        plan_batch(
            model, SEQ, cpu_profile(budget / GiB, batch_size=16), FakeProbe(readings=[reading()])
        )


def test_frozen_base_counts_once_and_checkpointing_shrinks_activations():
    model = tiny_bert()
    for param in model.bert.parameters():
        param.requires_grad = False
    probe = FakeProbe(readings=[reading()])
    plan = plan_batch(model, SEQ, cpu_profile(1.0, batch_size=4), probe)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    assert plan.estimate.grads == trainable * 4 and plan.estimate.optimizer == trainable * 8
    assert plan.estimate.weights == total * 4
    full = plan_batch(tiny_bert(), SEQ, cpu_profile(1.0, batch_size=4), probe)
    ckpt_model = tiny_bert()
    ckpt_model.gradient_checkpointing_enable()
    ckpt = plan_batch(ckpt_model, SEQ, cpu_profile(1.0, batch_size=4), probe)
    assert ckpt.checkpointing and not full.checkpointing
    assert ckpt.estimate.activations < full.estimate.activations


def test_verify_runs_two_steps_without_changing_the_weights_and_reports_the_ratio():
    model = tiny_bert()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    from laptrain.hardware.probe import TorchProbe

    plan = plan_batch(model, SEQ, cpu_profile(None, batch_size=4, verify=True), TorchProbe("cpu"))
    assert plan.measured_peak > 0
    assert "estimate / measured" in plan.summary_lines()[-1]
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    data = json.loads(plan.to_json())
    assert data["micro_batch"] == 4 and data["estimate"]["total"] > 0


class _Data:
    max_length = SEQ
    batch_size = 1
    eval_batch_size = 1


def test_run_entry_writes_json_and_keeps_the_batch_on_resume_without_touching_the_data(tmp_path):
    from laptrain.preflight.planner import estimated

    model = tiny_bert()
    hardware = cpu_profile(None, max_batch=8)
    plan = estimated(model, _Data(), hardware, CPU, output_dir=tmp_path)
    assert plan.micro_batch == 8
    data = _Data()
    record = json.loads((tmp_path / "preflight.json").read_text())
    record["micro_batch"], record["accumulation"] = 6, 2
    (tmp_path / "preflight.json").write_text(json.dumps(record))
    again = estimated(model, data, hardware, CPU, output_dir=tmp_path)
    assert (again.micro_batch, again.accumulation) == (6, 2)
    assert (data.batch_size, data.eval_batch_size) == (_Data().batch_size, _Data().eval_batch_size)
    assert "earlier session" in again.summary_lines()[-1]


def test_extra_ranks_take_rank_0s_plan_instead_of_measuring_device_0(tmp_path, monkeypatch):
    """Ranks the subprocess launcher starts run the preflight before their GPU is pinned: they
    read the plan rank 0 wrote (a batch they could not have found themselves here: 5)."""
    from laptrain.preflight import batch, planner

    model = tiny_bert()
    hardware = cpu_profile(None, max_batch=8)
    first = planner.estimated(model, _Data(), hardware, CPU, output_dir=tmp_path)
    record = json.loads((tmp_path / "preflight.json").read_text())
    record["micro_batch"], record["accumulation"] = 5, 3
    (tmp_path / "preflight.json").write_text(json.dumps(record))
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(batch, "plan_batch", lambda *a, **k: pytest.fail("rank 1 measured"))
    shared = planner.estimated(model, _Data(), hardware, CPU, output_dir=tmp_path)
    assert (shared.micro_batch, shared.accumulation) == (5, 3)
    assert shared.estimate == first.estimate and shared.budget == first.budget
    assert "rank 0" in shared.notes[-1]


def test_the_estimate_plans_a_transformers_model_and_the_measurement_any_other_module():
    from laptrain.preflight import planner

    assert planner.choose_planner(tiny_bert(), _Data()) is planner.estimated
    assert planner.choose_planner(torch.nn.Linear(4, 2), _Data()) is planner.measured


def test_refusal_marks_the_fixes_that_are_enough_on_their_own():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    short, full = (
        memory.estimate(1, SEQ // 4, "cpu", 0).total,
        memory.estimate(1, SEQ, "cpu", 0).total,
    )
    budget = (short + full) / 2
    with pytest.raises(PreflightError) as err:
        plan_batch(model, SEQ, cpu_profile(budget / GiB), FakeProbe(readings=[reading()]))
    fixes = str(err.value).split("Fixes, largest first: ")[1].split("; ")
    assert any("data.max_length=16" in f and f.endswith("(enough)") for f in fixes)
    assert not fixes[-1].startswith("none alone")


def test_verify_lowers_an_auto_batch_when_the_measured_peak_is_above_the_estimate(monkeypatch):
    import laptrain.preflight.batch as preflight

    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    budget = memory.estimate(16, SEQ, "cpu", 0).total + 1
    monkeypatch.setattr(
        preflight,
        "measure_peak",
        lambda model, micro, *a: 1.05 * memory.estimate(micro, SEQ, "cpu", 0).total,
    )
    probe = FakeProbe(readings=[reading()])
    plan = plan_batch(model, SEQ, cpu_profile(budget / GiB, effective_batch=32, verify=True), probe)
    assert plan.micro_batch < 16 and plan.micro_batch * plan.accumulation == 32
    assert 1.05 * plan.estimate.total <= budget
    assert "micro batch lowered 16 ->" in plan.summary_lines()[-1]


def test_auto_without_a_target_keeps_the_configured_accumulation():
    model = tiny_bert()
    plan = plan_batch(
        model, SEQ, cpu_profile(1.0, accumulation=4, max_batch=8), FakeProbe(readings=[reading()])
    )
    assert (plan.micro_batch, plan.accumulation) == (8, 4)


# ----- model.gradient_checkpointing: auto -------------------------------------------------------
def test_auto_checkpointing_stays_off_when_the_batch_fits_without_it():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    budget = memory.estimate(8, SEQ, "cpu", 0, checkpointing=False).total + 1
    profile = cpu_profile(budget / GiB, batch_size=8, auto_checkpointing=True)
    plan = plan_batch(model, SEQ, profile, FakeProbe(readings=[reading()]))
    assert not plan.checkpointing
    assert "gradient checkpointing off (model.gradient_checkpointing=auto" in plan.notes[0]
    assert "gradient checkpointing off" in plan.summary_lines()[1]


def test_auto_checkpointing_turns_on_when_the_batch_does_not_fit_without_it():
    model = tiny_bert()
    memory = model_memory(model, SEQ, "32-true")
    without = memory.estimate(8, SEQ, "cpu", 0, checkpointing=False).total
    with_it = memory.estimate(8, SEQ, "cpu", 0, checkpointing=True).total
    assert with_it < without
    profile = cpu_profile((with_it + 1) / GiB, batch_size=8)
    auto = replace(profile, auto_checkpointing=True)
    plan = plan_batch(model, SEQ, auto, FakeProbe(readings=[reading()]))
    assert plan.checkpointing and plan.micro_batch == 8
    assert plan.estimate.total == pytest.approx(with_it)
    assert f"needs {without / GiB:.2f} GiB > budget" in plan.notes[0]
    # the same job with checkpointing forced off is refused, naming it as the fix
    with pytest.raises(PreflightError, match="largest that fits"):
        plan_batch(model, SEQ, profile, FakeProbe(readings=[reading()]), checkpointing=False)


class _ShortData(_Data):
    """Tokenized data whose longest training example (24 tokens) is well under max_length."""

    def longest_example(self, split: str = "train") -> int:
        return 24


def test_run_entry_sizes_activations_by_the_longest_training_example_not_max_length():
    from laptrain.preflight.planner import estimated

    hardware = cpu_profile(None, batch_size=4)
    full = estimated(tiny_bert(), _Data(), hardware, CPU)
    short = estimated(tiny_bert(), _ShortData(), hardware, CPU)
    assert full.seq_len == _Data.max_length and short.seq_len == 24
    assert short.estimate.activations < full.estimate.activations / 2
    assert short.notes[0] == (
        f"sized by the longest training example, 24 tokens (data.max_length {_Data.max_length})"
    )
    assert "x 24 tokens" in short.summary_lines()[0]
