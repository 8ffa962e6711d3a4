"""TRM network, recursion, heads, loss, sizing and micro-batch accumulation (CPU, tiny shapes)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
import yaml

from laptrain.families.trm import TinyRecursiveModel, TRMArch, TRMSudokuModule
from laptrain.families.trm.carry import Carry
from laptrain.families.trm.loss import per_puzzle_answer_loss, stablemax_log_probs
from laptrain.families.trm.module import EagerFallback, check_precision
from laptrain.families.trm.sizing import choose_size, parse_presets
from laptrain.families.trm.sudoku import SudokuDataModule
from tests.conftest import quiet_trainer

SIZES = yaml.safe_load((Path(__file__).parents[1] / "conf/model/trm_sudoku.yaml").read_text())[
    "sizes"
]


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize(("size", "official"), [("paper", 5.03e6), ("paper_attention", 6.83e6)])
def test_paper_parameter_count_matches_official(size: str, official: float) -> None:
    module = TRMSudokuModule(vocab_size=11, seq_len=81, size=size, sizes=SIZES)
    assert abs(n_params(module) - official) / official < 0.02


def test_tiny_is_the_measured_188k_model() -> None:
    module = TRMSudokuModule(vocab_size=11, seq_len=81, size="tiny", sizes=SIZES)
    assert abs(n_params(module) - 188_000) < 1_000


@pytest.mark.parametrize("board", [4, 6, 9])
@pytest.mark.parametrize("mixer", ["mlp", "attention"])
def test_shapes_for_each_board(board: int, mixer: str) -> None:
    arch = TRMArch(
        vocab_size=board + 2,
        seq_len=board * board,
        hidden_size=32,
        num_heads=4,
        mixer=mixer,
        positions="rope" if mixer == "attention" else "none",
        prefix_len=2,
    )
    model = TinyRecursiveModel(arch)
    tokens = torch.randint(1, board + 2, (3, board * board))
    y, z = model.initial_states(3)
    out = model.supervision_step(model.embed_inputs(tokens), y, z)
    assert out.logits.shape == (3, board * board, board + 2)
    assert out.halt_logit.shape == (3,)
    assert out.y.shape == out.z.shape == (3, 2 + board * board, 32)


def small_model(**kw) -> TinyRecursiveModel:
    torch.manual_seed(0)
    arch = TRMArch(vocab_size=6, seq_len=16, hidden_size=16, cycles=3, latent_steps=2, **kw)
    return TinyRecursiveModel(arch)


def test_gradients_reach_only_the_last_recursion() -> None:
    model = small_model()
    calls: list[bool] = []
    grads: list[int] = []

    def hook(module, args, output):
        calls.append(output.requires_grad)
        if output.requires_grad:
            output.register_hook(lambda g: grads.append(1))

    model.net.register_forward_hook(hook)
    tokens = torch.randint(1, 6, (2, 16))
    y, z = model.initial_states(2)
    y.requires_grad_(True)
    out = model.supervision_step(model.embed_inputs(tokens), y, z)
    out.logits.sum().backward()
    # T=3, n=2: 2 latent recursions (6 net calls) without grad, then 3 calls with grad.
    assert calls == [False] * 6 + [True] * 3
    assert len(grads) == 3
    assert y.grad is None  # the carried-in state is not part of the graph


def test_carry_is_detached() -> None:
    model = small_model()
    y, z = model.initial_states(2)
    out = model.supervision_step(model.embed_inputs(torch.randint(1, 6, (2, 16))), y, z)
    assert out.logits.requires_grad
    assert not out.y.requires_grad and not out.z.requires_grad


def test_halt_head_starts_at_dont_halt() -> None:
    model = small_model()
    assert torch.count_nonzero(model.halt_head.weight) == 0
    y, z = model.initial_states(4)
    out = model.supervision_step(model.embed_inputs(torch.randint(1, 6, (4, 16))), y, z)
    torch.testing.assert_close(out.halt_logit, torch.full((4,), -5.0))


def test_stablemax_matches_its_formula() -> None:
    x = torch.tensor([[2.0, -1.0, 0.0, -3.0]])
    s = torch.tensor([3.0, 0.5, 1.0, 0.25], dtype=torch.float64)
    torch.testing.assert_close(stablemax_log_probs(x)[0], torch.log(s / s.sum()))
    labels = torch.tensor([[0]])
    loss = per_puzzle_answer_loss(x[:, None, :], labels, "stablemax")
    torch.testing.assert_close(loss, -torch.log(s[:1] / s.sum()).float())


def test_grad_checkpoint_gives_equal_gradients() -> None:
    tokens = torch.randint(1, 6, (2, 16))
    grads = []
    for flag in (False, True):
        model = small_model()
        model.grad_checkpoint = flag
        y, z = model.initial_states(2)
        model.supervision_step(model.embed_inputs(tokens), y, z).logits.square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b)


def test_compile_failure_warns_and_runs_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args, **kwargs):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: broken)
    module = TRMSudokuModule(vocab_size=6, seq_len=16, size="tiny", sizes=SIZES, compile=True)
    tokens = torch.randint(1, 6, (2, 16))
    with pytest.warns(UserWarning, match="torch.compile failed"):
        out = module.solve(tokens)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = module.solve(tokens)  # warns once only
    torch.testing.assert_close(out["pred"], again["pred"])


def test_bad_options_name_the_key() -> None:
    with pytest.raises(ValueError, match="model.size='huge'"):
        TRMSudokuModule(vocab_size=11, seq_len=81, size="huge", sizes=SIZES)
    with pytest.raises(ValueError, match="positions=rope needs mixer=attention"):
        TRMArch(vocab_size=11, seq_len=81, mixer="mlp", positions="rope")
    with pytest.raises(ValueError, match="model.sizes.tiny has unknown keys"):
        parse_presets({"tiny": {**SIZES["tiny"], "hiden_size": 3}})


def test_auto_size_follows_seed_ram_rule_within_budget() -> None:
    presets = parse_presets(SIZES)
    roomy = choose_size(presets, memory_gb=8, time_budget_min=1e6, target_samples=51200)
    assert roomy.name == "ram_8gb"
    assert choose_size(presets, 16, 1e6, 51200).name == "ram_16gb"
    assert choose_size(presets, 64, 1e6, 51200).name == "ram_32gb"


def test_auto_size_steps_down_when_the_budget_is_short() -> None:
    presets = parse_presets(SIZES)
    # 32 GB would pick ram_32gb (~300 min on the reference); 90 min allows ram_8gb (~26 min).
    choice = choose_size(presets, memory_gb=32, time_budget_min=90, target_samples=51200)
    assert choice.name == "ram_8gb"
    assert any("ram_32gb" in line and "min" in line for line in choice.lines)
    # Nothing but tiny fits 10 minutes on the reference ...
    assert choose_size(presets, 16, 10, 51200).name == "tiny"
    # ... while a machine 4x as fast fits ram_8gb into them.
    assert choose_size(presets, 16, 10, 51200, speed_scale=4).name == "ram_8gb"


def fit_steps(
    micro: int | None, steps: int, tmp_path: Path, callbacks: list | None = None, oom_above: int = 0
) -> TRMSudokuModule:
    sizes = {"tiny": {**SIZES["tiny"], "hidden_size": 32, "micro_batch_size": micro}}
    data = SudokuDataModule(
        board_size=4, givens=(6, 9), train_size=40, val_size=4, test_size=4, batch_size=64
    )
    data.prepare_data()
    data.setup("fit")
    torch.manual_seed(0)
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=sizes)
    if oom_above:
        real = module.supervision_step

        def step_with_fake_oom(inputs, y, z):
            if inputs.shape[0] > oom_above:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: (simulated)")
            return real(inputs, y, z)

        module.supervision_step = step_with_fake_oom
    trainer = quiet_trainer(
        max_steps=steps,
        callbacks=callbacks,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    return module


def test_micro_batches_give_the_same_update_as_the_whole_carry(tmp_path: Path) -> None:
    whole = fit_steps(None, 3, tmp_path)
    chunked = fit_steps(16, 3, tmp_path)
    for (name, a), b in zip(whole.named_parameters(), chunked.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(whole.carry.y, chunked.carry.y, rtol=1e-3, atol=1e-3)


def test_halt_at_eval_takes_the_answer_at_the_first_halt() -> None:
    sizes = {"tiny": {**SIZES["tiny"], "hidden_size": 16, "n_sup": 4}}
    module = TRMSudokuModule(vocab_size=6, seq_len=16, size="tiny", sizes=sizes, halt_at_eval=True)
    with torch.no_grad():
        module.model.halt_head.bias.fill_(5.0)  # every puzzle halts after its first step
    tokens = torch.randint(1, 6, (3, 16))
    result = module.solve(tokens)
    assert result["steps"].tolist() == [1, 1, 1]
    torch.testing.assert_close(result["pred"], result["step_preds"][0])
    module.halt_at_eval = False  # paper: all n_sup steps
    assert module.solve(tokens)["steps"].tolist() == [4, 4, 4]


def test_half_precision_is_refused_off_cuda() -> None:
    with pytest.raises(ValueError, match="hardware.precision=32-true"):
        check_precision("mps", "16-mixed")
    with pytest.raises(ValueError, match="hardware.precision=32-true"):
        check_precision("cpu", "bf16-mixed")
    check_precision("cuda", "bf16-mixed")
    check_precision("mps", "32-true")


def test_auto_dry_run_prints_estimates_and_choice(capsys: pytest.CaptureFixture[str]) -> None:
    from laptrain.families.trm.sizing import main

    config = str(Path(__file__).parents[1] / "conf/model/trm_sudoku.yaml")
    main(["--config", config, "--memory-gb", "16", "--budget-min", "60"])
    out = capsys.readouterr().out
    assert "field note 002's RAM class picks 'ram_16gb'" in out
    assert "~122 min" in out and "chose 'ram_8gb'" in out


def test_out_of_memory_splits_the_chunk_and_keeps_the_update(tmp_path: Path) -> None:
    from laptrain.callbacks.oom_backoff import OOMBackoff

    whole = fit_steps(None, 2, tmp_path)
    backoff = OOMBackoff()
    with pytest.warns(UserWarning, match="out of memory"):
        split = fit_steps(None, 2, tmp_path, callbacks=[backoff], oom_above=16)
    assert backoff.micro_batch == 16  # 64 -> 32 -> 16
    for (name, a), b in zip(whole.named_parameters(), split.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("precision", ["bf16-true", "16-true"])
def test_steps_run_when_a_precision_plugin_changes_the_default_dtype(
    tmp_path: Path, precision: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Lightning's HalfPrecision sets the default dtype inside each step (plugins/precision/half.py
    # forward_context); TRM allocated halt_logit in it and index_put refused the float32 head.
    # TRM refuses these precisions (check_precision); bypassed here to test the mechanism on CPU.
    monkeypatch.setattr("laptrain.families.trm.module.check_precision", lambda *a: None)
    sizes = {"tiny": {**SIZES["tiny"], "hidden_size": 16, "n_sup": 2, "ema_decay": 0.0}}
    data = SudokuDataModule(
        board_size=4, givens=(6, 9), train_size=16, val_size=4, test_size=4, batch_size=8
    )
    module = TRMSudokuModule(**data.model_kwargs(), size="tiny", sizes=sizes)
    trainer = quiet_trainer(
        max_steps=2,
        precision=precision,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    half = torch.bfloat16 if precision == "bf16-true" else torch.float16
    assert module.carry.y.dtype == half == module.state_dtype


def test_true_half_precisions_are_refused_everywhere() -> None:
    for device in ("cuda", "mps", "cpu"):
        for precision in ("16-true", "bf16-true"):
            with pytest.raises(ValueError, match="bf16-mixed"):
                check_precision(device, precision)
    check_precision("cuda", "16-mixed")
    check_precision("cpu", "64-true")


def test_a_restored_carry_follows_the_module(tmp_path: Path) -> None:
    module = TRMSudokuModule(vocab_size=6, seq_len=16, size="tiny", sizes=SIZES)
    carry = Carry.empty(2, module.arch.total_len, module.arch.hidden_size, 16, torch.device("cpu"))
    module.on_load_checkpoint(
        {"trm": {"explore_rng": module.explore_rng.get_state(), "carry": carry.state_dict()}}
    )
    module.double()  # what 64-true's convert_module does after the restore
    module.on_fit_start()
    assert module.carry.y.dtype == module.carry.z.dtype == torch.float64
    assert module.carry.steps.dtype == torch.long


OOM_ERRORS = [
    torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
    RuntimeError("MPS backend out of memory (MPS allocated: 9.00 GB, other allocations: 1 GB)"),
    RuntimeError("Invalid buffer size: 12.00 GB"),
    RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1073741824 bytes"
    ),
]


@pytest.mark.parametrize("error", OOM_ERRORS, ids=lambda e: str(e)[:20])
def test_compiled_net_out_of_memory_reaches_the_backoff(error: Exception) -> None:
    calls: list[str] = []

    def compiled(*args: torch.Tensor) -> torch.Tensor:
        calls.append("compiled")
        if len(calls) == 1:
            raise error
        return args[0]

    def eager(*args: torch.Tensor) -> torch.Tensor:
        calls.append("eager")
        return args[0]

    call = EagerFallback(compiled, eager)  # type: ignore[arg-type]
    x = torch.zeros(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "torch.compile failed" warning
        with pytest.raises(type(error), match=str(error)[:10]):
            call(x, x)
        call(x, x)  # the retry after the backoff split the chunk: compiled again
    assert not call.failed
    assert calls == ["compiled", "compiled"]


def test_other_compiled_net_errors_still_fall_back() -> None:
    def compiled(*args: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("inductor: no C compiler")

    call = EagerFallback(compiled, lambda *args: args[0])  # type: ignore[arg-type]
    with pytest.warns(UserWarning, match="torch.compile failed"):
        call(torch.zeros(1), torch.zeros(1))
    assert call.failed
