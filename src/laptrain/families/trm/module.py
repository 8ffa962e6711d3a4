"""LightningModule for TRM on Sudoku: deep supervision with a carry, ACT halting, manual optimization.

One training step = one supervision step of every carry slot = one optimizer step (docs/trm.md).
Halted slots take the batch row of the same index (the official code does the same, so unused
rows of a batch are dropped) and restart from the fixed y, z. Loss = stable-max CE averaged over a
puzzle's cells, summed over slots, + 0.5 x BCE(halt logit, "grid right"), divided by the number of
slots. With ``micro_batch_size`` the slots are processed in chunks with a backward per chunk and
one optimizer step, which gives the same update as the whole carry at once.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from functools import partial
from typing import Any

import lightning.pytorch as pl
import torch

from laptrain.callbacks.oom_backoff import is_oom
from laptrain.families.trm.carry import Carry
from laptrain.families.trm.ema import EMA
from laptrain.families.trm.loss import LOSSES, halt_loss, per_puzzle_answer_loss
from laptrain.families.trm.metrics import SudokuMetrics
from laptrain.families.trm.network import StepOutput, TinyRecursiveModel, TRMArch
from laptrain.families.trm.sizing import SizePreset, parse_presets
from laptrain.model.chunked_backward import ChunkedBackward


class EagerFallback:
    """Call a compiled net; on its first failure warn once and use the eager net from then on.

    An out-of-memory error is not a compile failure: it propagates (compile stays on), so the
    OOM backoff (``laptrain.callbacks.oom_backoff``) can split the chunk and retry.
    """

    def __init__(self, compiled: Callable[..., torch.Tensor], eager: torch.nn.Module) -> None:
        self.compiled = compiled
        self.eager = eager
        self.failed = False

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        if not self.failed:
            try:
                return self.compiled(*args)
            except Exception as err:  # compile errors surface at the first call, of many types
                if is_oom(err):
                    raise
                self.failed = True
                warnings.warn(
                    f"torch.compile failed ({type(err).__name__}: {str(err)[:200]}); running eager."
                    " Set model.compile=false to skip the attempt.",
                    stacklevel=2,
                )
        return self.eager(*args)


def resolve_size(size: str, presets: Mapping[str, SizePreset]) -> str:
    """The preset name for ``size``. ``auto`` never reaches here from ``train.py``: the model
    YAML's ``_argv_hook_`` (laptrain/families/trm/sizing.py) resolves it on the command line, the one
    place that decides it, so ``--cfg job`` shows the choice."""
    if size == "auto":
        raise ValueError(
            "model.size=auto is chosen by train.py before Hydra composes; when building the "
            f"module yourself pick a preset: model.size=<one of {', '.join(sorted(presets))}>"
        )
    if size not in presets:
        raise ValueError(f"model.size={size!r}: choose auto or one of {sorted(presets)}")
    return size


def refuse_precision(device_type: str, precision: str) -> str | None:
    """Why TRM does not train at ``precision`` on ``device_type``, or None.

    TRM trains float32 weights: in float32 on CPU and MPS, or bf16-mixed / 16-mixed on CUDA.
    Half precision runs only on CUDA (docs/trm.md: a Lightning port of TRM forces float32 on MPS
    to avoid NaNs). ``16-true`` / ``bf16-true`` are refused everywhere: half-precision weights
    round away AdamW's small updates (lr 1e-4 on weights ~0.05 is below bfloat16's step there),
    and the official code keeps float32 weights and casts them to bfloat16 only in the forward
    (SamsungSAILMontreal/TinyRecursiveModels, models/layers.py ``CastedLinear``), which is
    Lightning's bf16-mixed. ``64-true`` runs (a float64 correctness mode on CPU).
    """
    text = str(precision)
    if device_type in ("cpu", "mps") and "16" in text:
        return (
            f"TRM runs float32 on {device_type} (precision={precision}): set "
            "hardware.precision=32-true, or train on CUDA for bf16-mixed"
        )
    if text.endswith("16-true"):
        return (
            f"TRM keeps float32 weights (precision={precision}): set hardware.precision=bf16-mixed"
            " (what the official code does: float32 weights, a bfloat16 forward) or 32-true"
        )
    return None


def check_precision(device_type: str, precision: str) -> None:
    """:func:`refuse_precision` as a ValueError (the module checks it again at fit start)."""
    reason = refuse_precision(device_type, precision)
    if reason:
        raise ValueError(reason)


def _checked_preset(
    sizes: Mapping[str, Mapping[str, Any]] | None, size: str, loss: str, exploration_prob: float
) -> tuple[str, SizePreset]:
    """The preset ``size`` names and its name, once the module's arguments are checked."""
    if not sizes:
        raise ValueError("model.sizes is empty; use model=trm_sudoku, which defines them")
    if loss not in LOSSES:
        raise ValueError(f"model.loss={loss!r}: choose one of {LOSSES}")
    if not 0.0 <= exploration_prob <= 1.0:
        raise ValueError(f"model.exploration_prob={exploration_prob} must be in [0, 1]")
    presets = parse_presets(sizes)
    name = resolve_size(size, presets)
    micro = presets[name].micro_batch_size
    if micro is not None and micro < 1:
        raise ValueError(f"model.sizes.{name}.micro_batch_size must be >= 1 or null")
    return name, presets[name]


def _arch(vocab_size: int, seq_len: int, p: SizePreset) -> TRMArch:
    """The network shape of preset ``p``: every field of it that :class:`TRMArch` has."""
    given = {f.name for f in fields(p)}
    shape = {f.name: getattr(p, f.name) for f in fields(TRMArch) if f.name in given}
    return TRMArch(vocab_size=vocab_size, seq_len=seq_len, **shape)


class TRMSudokuModule(ChunkedBackward, pl.LightningModule):
    """Tiny Recursive Model trained on Sudoku with deep supervision, ACT halting and an EMA.

    Args:
        vocab_size, seq_len: from the datamodule (pad 0, blank 1, digits 2..; cells per board).
        size: a key of ``sizes`` (``auto`` is resolved on the command line by the YAML's
            ``_argv_hook_``, from ``memory_gb`` and ``time_budget_min``).
        sizes: presets (see ``conf/model/trm_sudoku.yaml`` and :class:`SizePreset`).
        memory_gb: RAM for ``size=auto``; None = this machine's total RAM (recorded only).
        time_budget_min, auto_target_samples: the budget ``auto`` must fit, and the supervision
            samples a useful run needs.
        loss: ``stablemax`` (paper) or ``softmax`` cross-entropy.
        halting: train the halt head's decisions (ACT); off = every puzzle runs ``n_sup`` steps.
        halt_at_eval: evaluate each puzzle at its first halting step (off = paper: all steps).
        exploration_prob: chance that a fresh slot must first reach a random 2..n_sup steps.
        betas: AdamW betas (paper: 0.9, 0.95).
        compile: ``torch.compile`` the network (falls back to eager with a warning).
        grad_checkpoint: recompute the recursion with gradients in backward (saves memory).
        seed: seed of the exploration draws (their generator is in the checkpoint).
    """

    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        size: str = "tiny",
        sizes: Mapping[str, Mapping[str, Any]] | None = None,
        memory_gb: float | None = None,
        time_budget_min: float = 60.0,
        auto_target_samples: int = 51200,
        loss: str = "stablemax",
        halting: bool = True,
        halt_at_eval: bool = False,
        exploration_prob: float = 0.1,
        betas: Sequence[float] = (0.9, 0.95),
        compile: bool = False,
        grad_checkpoint: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__()
        name, self.preset = _checked_preset(sizes, size, loss, exploration_prob)
        hparams = {
            "vocab_size": vocab_size, "seq_len": seq_len, "size": size, "chosen_size": name,
            "sizes": {k: dict(v) for k, v in sizes.items()}, "memory_gb": memory_gb,
            "time_budget_min": time_budget_min, "auto_target_samples": auto_target_samples,
            "loss": loss, "halting": halting, "halt_at_eval": halt_at_eval,
            "exploration_prob": exploration_prob, "betas": [float(b) for b in betas],
            "compile": compile, "grad_checkpoint": grad_checkpoint, "seed": seed,
        }  # fmt: skip
        self.save_hyperparameters(hparams)
        p = self.preset
        self.arch = _arch(vocab_size, seq_len, p)
        self.model = TinyRecursiveModel(self.arch, grad_checkpoint=grad_checkpoint)
        if compile:
            self.model.set_net_call(EagerFallback(torch.compile(self.model.net), self.model.net))
        self.automatic_optimization = False
        self.loss_kind = loss
        self.halting = halting
        self.halt_at_eval = halt_at_eval
        self.exploration_prob = exploration_prob
        self.n_sup = p.n_sup
        self.micro_batch_size = p.micro_batch_size
        self.explore_rng = torch.Generator().manual_seed(seed)
        self.carry: Carry | None = None
        self.val_metrics = SudokuMetrics(p.n_sup)
        self.test_metrics = SudokuMetrics(p.n_sup)
        self._last_step_end: float | None = None

    def setup(self, stage: str) -> None:
        check_precision(self.trainer.strategy.root_device.type, self.trainer.precision)

    # ----- optimisation -------------------------------------------------------------------
    def configure_optimizers(self) -> dict[str, Any]:
        p = self.preset
        optimizer = torch.optim.AdamW(
            self.parameters(), lr=p.lr, betas=tuple(self.hparams.betas), weight_decay=p.weight_decay
        )
        warmup = max(1, p.warmup_steps)
        # Linear warm-up, then constant (the official lr_min_ratio 1.0 makes its cosine flat).
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda s: min(1.0, (s + 1) / warmup)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    def configure_callbacks(self) -> list[pl.Callback]:
        return [EMA(decay=self.preset.ema_decay)] if self.preset.ema_decay > 0 else []

    # ----- training -----------------------------------------------------------------------
    @property
    def state_dtype(self) -> torch.dtype:
        """dtype of the recursion states y, z: that of the network's start vectors (float32, or the
        precision plugin's after ``convert_module``), never the default dtype of the moment."""
        return self.model.y_init.dtype

    def _place_carry(self) -> None:
        c = self.carry
        if c is not None and (c.y.device != self.device or c.y.dtype != self.state_dtype):
            self.carry = c.to(self.device, self.state_dtype)

    def on_fit_start(self) -> None:
        # A carry restored from a checkpoint was loaded before Lightning moved and converted the
        # module (Trainer._run: restore, then strategy.setup); put it beside the weights now.
        self._place_carry()

    def _refill(self, inputs: torch.Tensor, labels: torch.Tensor) -> Carry:
        batch = inputs.shape[0]
        dtype = self.state_dtype
        if self.carry is None or self.carry.size != batch:
            self.carry = Carry.empty(
                batch,
                self.arch.total_len,
                self.arch.hidden_size,
                self.arch.seq_len,
                self.device,
                dtype,
            )
        self._place_carry()
        c = self.carry
        # Drawn for every slot every step, so the stream of draws does not depend on halting.
        explore = torch.rand(batch, generator=self.explore_rng) < self.exploration_prob
        minimum = torch.randint(2, self.n_sup + 1, (batch,), generator=self.explore_rng)
        minimum = (minimum * explore).to(self.device)
        fresh = c.halted
        y0, z0 = self.model.initial_states(batch)
        c.y = torch.where(fresh[:, None, None], y0.to(c.y.dtype), c.y)
        c.z = torch.where(fresh[:, None, None], z0.to(c.z.dtype), c.z)
        c.inputs = torch.where(fresh[:, None], inputs, c.inputs)
        c.labels = torch.where(fresh[:, None], labels, c.labels)
        c.steps = torch.where(fresh, 0, c.steps)
        c.min_steps = torch.where(fresh, minimum, c.min_steps)
        return c

    def _chunks(self, batch: int) -> list[slice]:
        size = self.micro_batch_size or batch
        return [slice(i, min(i + size, batch)) for i in range(0, batch, size)]

    def supervision_step(
        self, inputs: torch.Tensor, y: torch.Tensor, z: torch.Tensor
    ) -> StepOutput:
        return self.model.supervision_step(self.model.embed_inputs(inputs), y, z)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        c = self._refill(batch["inputs"], batch["labels"])
        slots = c.size
        fresh = int(c.halted.sum())
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        optimizer.zero_grad(set_to_none=True)
        new_y, new_z = torch.empty_like(c.y), torch.empty_like(c.z)
        pred = torch.empty_like(c.labels)
        # Explicit dtypes: a "-true" precision plugin sets the default dtype inside the step
        # (lightning/pytorch/plugins/precision/half.py forward_context), and index_put below
        # refuses a source of another dtype. The halt head returns float32 (network.py).
        halt_logit = torch.empty(slots, dtype=torch.float32, device=self.device)

        def chunk_loss(chunk: dict[str, torch.Tensor], share: float) -> torch.Tensor:
            """Mean loss of a chunk of slots, times its share of all slots; keeps its outputs."""
            out = self.supervision_step(chunk["inputs"], chunk["y"], chunk["z"])
            solved = (out.logits.argmax(-1) == chunk["labels"]).all(-1)
            answer = per_puzzle_answer_loss(out.logits, chunk["labels"], self.loss_kind)
            per_slot = answer + 0.5 * halt_loss(out.halt_logit, solved)
            idx = chunk["index"]
            new_y[idx], new_z[idx] = out.y, out.z
            pred[idx] = out.logits.detach().argmax(-1)
            halt_logit[idx] = out.halt_logit.detach()
            return per_slot.mean() * share

        # Each micro-chunk goes through laptrain's ChunkedBackward, so the OOMBackoff callback can
        # split a chunk that runs out of memory; the update stays that of the whole carry.
        index = torch.arange(slots, device=self.device)
        total = torch.zeros((), dtype=torch.float32, device=self.device)
        for part in self._chunks(slots):
            chunk = {"inputs": c.inputs[part], "labels": c.labels[part], "y": c.y[part]}
            chunk |= {"z": c.z[part], "index": index[part]}
            share = (part.stop - part.start) / slots
            total = total + self.chunked_backward(chunk, partial(chunk_loss, share=share))
        optimizer.step()
        scheduler.step()

        self._advance(c, new_y, new_z, halt_logit)
        self.log("train/loss", total, prog_bar=True, on_step=True, on_epoch=False)
        # The other metrics cost a few ms per step: compute them only when the trainer writes logs.
        if self.global_step % max(1, self.trainer.log_every_n_steps) == 0:
            self._log_train(pred, halt_logit, c, fresh, slots, start)
        else:
            self._last_step_end = time.perf_counter()
        return total

    def _advance(
        self, c: Carry, y: torch.Tensor, z: torch.Tensor, halt_logit: torch.Tensor
    ) -> None:
        """The carry after a step: new states, one more step, halted at ``n_sup`` steps (or, with
        ``halting``, where the halt head says so once the slot's minimum is reached)."""
        c.y, c.z = y, z
        c.steps = c.steps + 1
        halted = c.steps >= self.n_sup
        if self.halting:
            halted = halted | ((halt_logit > 0) & (c.steps >= c.min_steps))
        c.halted = halted

    def _log_train(
        self,
        pred: torch.Tensor,
        halt_logit: torch.Tensor,
        c: Carry,
        fresh: int,
        slots: int,
        start: float,
    ) -> None:
        now = time.perf_counter()
        # Time from the previous step's end covers data loading and Lightning's own work too.
        elapsed = now - (self._last_step_end or start)
        self._last_step_end = now
        done = c.halted
        logs = {
            "train/fresh_puzzles": float(fresh),
            "train/samples_per_s": slots / elapsed,
            "train/puzzles_per_s": float(done.sum()) / elapsed,
        }
        if done.any():
            correct = pred[done] == c.labels[done]
            solved = correct.all(-1)
            blank = c.inputs[done] == 1
            logs["train/exact_acc"] = solved.float().mean()
            logs["train/blank_acc"] = (correct & blank).sum() / blank.sum().clamp(min=1)
            logs["train/halt_acc"] = ((halt_logit[done] > 0) == solved).float().mean()
            logs["train/steps"] = c.steps[done].float().mean()
        self.log_dict(logs, on_step=True, on_epoch=False)

    # ----- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def solve(self, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
        """Run up to ``n_sup`` supervision steps from fresh states; returns per-step predictions.

        Keys: ``pred`` (the answer taken: last step, or the halting step with ``halt_at_eval``),
        ``halt_logit`` and ``steps`` for it, and ``step_preds`` [n_sup, B, L].
        """
        x = self.model.embed_inputs(inputs)
        y, z = self.model.initial_states(inputs.shape[0])
        taken = torch.zeros_like(inputs)
        taken_halt = torch.zeros(inputs.shape[0], dtype=torch.float32, device=inputs.device)
        steps = torch.full((inputs.shape[0],), self.n_sup, device=inputs.device)
        done = torch.zeros(inputs.shape[0], dtype=torch.bool, device=inputs.device)
        step_preds = []
        for k in range(self.n_sup):
            out = self.model.supervision_step(x, y, z)
            y, z = out.y, out.z
            pred = out.logits.argmax(-1)
            step_preds.append(pred)
            take = ~done
            taken = torch.where(take[:, None], pred, taken)
            taken_halt = torch.where(take, out.halt_logit, taken_halt)
            if self.halt_at_eval:
                stop = take & (out.halt_logit > 0)
                steps = torch.where(stop, k + 1, steps)
                done = done | stop
        return {"pred": taken, "halt_logit": taken_halt, "steps": steps, "step_preds": step_preds}

    def _eval_step(self, batch: dict[str, torch.Tensor], metrics: SudokuMetrics) -> None:
        result = self.solve(batch["inputs"])
        for k, pred in enumerate(result["step_preds"]):
            metrics.update_step(k, pred, batch["labels"])
        metrics.update(
            result["pred"], batch["labels"], batch["inputs"], result["halt_logit"], result["steps"]
        )

    def _log_eval(self, stage: str, metrics: SudokuMetrics) -> None:
        values = metrics.compute()
        metrics.reset()
        if not values:
            return
        logs = {f"{stage}/{k}": v for k, v in values.items()}
        # The project monitors `<stage>/acc` by default; for Sudoku it is the exact accuracy.
        logs[f"{stage}/acc"] = values["exact_acc"]
        # compute() has summed the counts of every rank already; sync_dist only averages equal
        # values and keeps Lightning from warning that epoch-level values are not synced
        self.log_dict(logs, sync_dist=True)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_metrics)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_metrics)

    # ----- checkpoint ---------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["trm"] = {
            "version": 1,
            "carry": self.carry.state_dict() if self.carry is not None else None,
            "explore_rng": self.explore_rng.get_state(),
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("trm")
        if state is None:
            return
        self.explore_rng.set_state(state["explore_rng"])
        carry = state["carry"]
        self.carry = Carry.from_state_dict(carry) if carry is not None else None
