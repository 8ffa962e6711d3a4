"""GRPO (group relative policy optimisation) on the LoRA family: the adapters learn from rewards
computed on their own completions.

Each training batch of prompts (``laptrain.families.lora.prompts``) is rolled out: every prompt
gets ``num_generations`` completions sampled with the adapters on (``grpo_sampling``: KV cache,
``temperature``, ``top_p``, ``max_new_tokens``, a generator per prompt), scored by the
reward functions (``grpo_rewards``), and the clipped policy-gradient step of ``grpo_loss`` is
taken on the completion tokens with advantages normalised within each prompt's group. The
reference (``beta`` > 0 only) is the base with the adapters switched off, as in DPO.

``num_iterations`` > 1 (several policy updates per rollout) is a rollout buffer under Lightning's
automatic optimisation: the datamodule serves each batch ``num_iterations`` times in a row
(``data.repeat``), the first serving samples and keeps the rollout with its old log-probabilities,
the others reuse it. Gradient accumulation, clipping, schedulers, the OOM backoff and the stop
callbacks then work as for any module; manual optimisation would have lost them. The buffer and
its use count are in every checkpoint, so a run stopped between policy updates resumes exactly.

Several processes: each rank rolls out its own prompts (the datamodule's share of each global
batch), a prompt's group stays on its rank, so the advantages are those of one process, and a
prompt's completions depend only on (``sampling_seed``, epoch, its row in the split), so 2 ranks
x B prompts sample what 1 process x 2B samples. The loss's divisor (completion tokens for
``dapo``, completions otherwise) is the whole step's over the ranks
(``CausalLMLoRAModule.on_before_optimizer_step``).
"""

from __future__ import annotations

from typing import Any

import torch
from torchmetrics import MeanMetric

from laptrain.families.lora.causal_lm import CausalLMLoRAModule, response_head
from laptrain.families.lora.dpo import load_adapters
from laptrain.families.lora.grpo_loss import LOSS_TYPES, group_advantages, loss_sum, token_terms
from laptrain.families.lora.grpo_rewards import Reward, load_rewards, score
from laptrain.families.lora.grpo_sampling import completion_logps, prompt_generators, sample

STATE_KEY = "laptrain_grpo"


def _check(num_generations: int, loss_type: str, num_iterations: int, temperature: float,
           top_p: float) -> None:  # fmt: skip
    if num_generations < 2:
        raise ValueError(
            f"model.num_generations={num_generations}: GRPO compares completions within a group, "
            "so it needs at least 2 per prompt (8 is TRL's default)"
        )
    if loss_type not in LOSS_TYPES:
        raise ValueError(
            f"model.loss_type must be one of {', '.join(LOSS_TYPES)} (got {loss_type!r})"
        )
    if num_iterations < 1:
        raise ValueError(f"model.num_iterations must be >= 1 (got {num_iterations})")
    if not temperature > 0 or not 0 < top_p <= 1:
        raise ValueError(
            f"model.temperature must be > 0 and model.top_p in (0, 1] (got {temperature}, {top_p})"
        )


class GRPOLoRAModule(CausalLMLoRAModule):
    """LoRA trained with GRPO on prompt batches (``PromptDataModule``).

    Args:
        rewards: reward functions by import path, or ``{path, **keywords}`` (``grpo_rewards``).
        reward_weights: one weight per reward; null: 1 each.
        num_generations: completions per prompt (the group); >= 2. TRL: 8.
        max_new_tokens: longest completion (TRL's ``max_completion_length``, 512 there).
        temperature, top_p: sampling (TRL: 1.0, 1.0); the log-probabilities use the same
            temperature, as TRL's.
        beta: weight of the k3 KL to the base (adapters off); 0 (TRL's default) skips the
            reference pass.
        epsilon, epsilon_high: the clip range ``[1 - epsilon, 1 + epsilon_high]`` (TRL: 0.2,
            epsilon_high = epsilon).
        loss_type: grpo, dr_grpo or dapo (TRL's default).
        scale_rewards: divide advantages by the group's std (TRL's ``scale_rewards="group"``);
            false: Dr. GRPO's unscaled advantages.
        num_iterations: policy updates per rollout (TRL: 1); ``data.repeat`` must equal it.
        sampling_seed: with the epoch and a prompt's row, the seed of that prompt's sampling.
        init_adapters: a LoRA run or adapter folder to start from.
        Others as ``CausalLMLoRAModule``.
    """

    def __init__(
        self,
        *args: Any,
        rewards: list[Any] | None = None,
        reward_weights: list[float] | None = None,
        num_generations: int = 8,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        beta: float = 0.0,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        loss_type: str = "dapo",
        scale_rewards: bool = True,
        num_iterations: int = 1,
        sampling_seed: int = 0,
        init_adapters: str | None = None,
        **kwargs: Any,
    ) -> None:
        _check(num_generations, loss_type, num_iterations, temperature, top_p)
        self.rewards: list[Reward] = load_rewards(list(rewards or []), reward_weights)
        super().__init__(*args, **kwargs)
        if init_adapters:
            load_adapters(self.model, init_adapters)
        self.num_generations, self.max_new_tokens = int(num_generations), int(max_new_tokens)
        self.temperature, self.top_p, self.beta = float(temperature), float(top_p), float(beta)
        self.epsilon, self.epsilon_high = float(epsilon), epsilon_high
        self.loss_type, self.scale_rewards = loss_type, bool(scale_rewards)
        self.num_iterations = int(num_iterations)
        self.sampling_seed = int(sampling_seed)
        self._rollout: dict[str, torch.Tensor] | None = None
        self._rollout_uses = 0
        # the held-out means: the total, then each reward's own (its curve in TensorBoard)
        self.held_out = torch.nn.ModuleDict(
            {key: torch.nn.ModuleList(MeanMetric() for _ in range(len(self.rewards) + 1))
             for key in ("val/reward", "test/reward", "test/reward_base")}
        )  # fmt: skip

    # ----- rollouts ---------------------------------------------------------------------------
    def _stop_ids(self) -> list[int]:
        from laptrain.families.lora.tools import end_of_turn_ids

        return end_of_turn_ids(self.tokenizer)

    def _complete(
        self, batch: dict[str, Any], copies: int, generators: list[torch.Generator] | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``copies`` completions per prompt (greedy without ``generators``, one per prompt) and
        their total rewards: ``(prompt_ids, prompt_mask, completion_ids, completion_mask, scores
        [N, R])``."""
        ids = batch["prompt_ids"].repeat_interleave(copies, 0)
        mask = batch["attention_mask"].repeat_interleave(copies, 0)
        pad = int(self.tokenizer.pad_token_id)
        done, done_mask = sample(
            self.model, ids, mask, self.max_new_tokens, self._stop_ids(), pad, generators,
            self.temperature, self.top_p,
        )  # fmt: skip
        texts = self.tokenizer.batch_decode(done.masked_fill(done_mask == 0, pad).tolist(),
                                            skip_special_tokens=True)  # fmt: skip
        rows = []
        for i, prompt in enumerate(batch["prompts"]):  # one call per group: errors name its prompt
            columns = {k: [v[i]] * copies for k, v in batch["columns"].items()}
            rows += score(self.rewards, [prompt] * copies, texts[i * copies : (i + 1) * copies],
                          columns)  # fmt: skip
        return ids, mask, done, done_mask, torch.tensor(rows, dtype=torch.float32)

    def _total(self, scores: torch.Tensor) -> torch.Tensor:
        return scores @ torch.tensor([r.weight for r in self.rewards], dtype=scores.dtype)

    def _logps(self, rollout: dict[str, torch.Tensor]) -> torch.Tensor:
        return completion_logps(
            self.model, rollout["prompt_ids"], rollout["prompt_mask"], rollout["completion_ids"],
            rollout["completion_mask"], self.temperature, response_head(self.model),
            self._may_share_prefix(),
        )  # fmt: skip

    def roll_out(self, batch: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Sample, score and keep what the policy updates of this batch need."""
        generators = prompt_generators(self.sampling_seed, self.current_epoch, batch["rows"])
        ids, mask, done, done_mask, scores = self._complete(batch, self.num_generations, generators)
        total = self._total(scores)
        rollout = {
            "prompt_ids": ids, "prompt_mask": mask, "completion_ids": done,
            "completion_mask": done_mask, "scores": scores.to(self.device),
            "advantages": group_advantages(total, self.num_generations, self.scale_rewards).to(
                self.device),
            "group_std": total.view(-1, self.num_generations).std(dim=1).to(self.device),
        }  # fmt: skip
        with torch.no_grad():
            if self.num_iterations > 1:
                rollout["old_logps"] = self._logps(rollout)
            if self.beta != 0.0:
                with self.model.disable_adapter():
                    rollout["ref_logps"] = self._logps(rollout)
        return rollout

    # ----- the memory preflight (laptrain.model.contracts.SizesItsStep) ----------------------
    def preflight_batch(self, batch_size: int, seq_len: int) -> dict[str, torch.Tensor]:
        """``batch_size`` random prompts of ``seq_len`` tokens (the longest prompt)."""
        vocab = int(self.model.get_input_embeddings().weight.shape[0])
        generator = torch.Generator().manual_seed(batch_size * 100_003 + seq_len)
        ids = torch.randint(0, vocab, (batch_size, seq_len), generator=generator)
        return {"prompt_ids": ids, "attention_mask": torch.ones_like(ids)}

    def preflight_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The step's memory: ``num_generations`` completions per prompt sampled with the KV cache
        to their full ``max_new_tokens`` (no stop token), the reference pass when ``beta`` > 0 and
        the policy pass with its loss."""
        batch = {k: v.to(self.device) for k, v in batch.items()}
        ids = batch["prompt_ids"].repeat_interleave(self.num_generations, 0)
        mask = batch["attention_mask"].repeat_interleave(self.num_generations, 0)
        done, done_mask = sample(
            self.model, ids, mask, self.max_new_tokens, [-1], 0, [torch.Generator().manual_seed(0)],
            self.temperature, self.top_p,
        )  # fmt: skip
        rollout = {"prompt_ids": ids, "prompt_mask": mask, "completion_ids": done,
                   "completion_mask": done_mask}  # fmt: skip
        reference = None
        if self.beta != 0.0:
            with torch.no_grad(), self.model.disable_adapter():
                reference = self._logps(rollout)
        logps = self._logps(rollout)
        advantages = torch.linspace(-1, 1, logps.shape[0], device=logps.device)
        terms = token_terms(logps, logps.detach(), advantages, self.epsilon, self.epsilon_high,
                            self.beta, reference)  # fmt: skip
        total, count = loss_sum(terms.loss, done_mask, self.loss_type, self.max_new_tokens)
        return total / max(count, 1)

    # ----- training ---------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self._rollout is None or self._rollout_uses >= self.num_iterations:
            self._rollout, self._rollout_uses = self.roll_out(batch), 0
        self._rollout_uses += 1
        rollout = {k: v.to(self.device) for k, v in self._rollout.items()}  # restored on the CPU
        per_tokens = self.loss_type == "dapo"
        rows = rollout["completion_ids"].shape[0]
        tokens = int(rollout["completion_mask"].sum())
        scale = self._share_of_step(tokens if per_tokens else rows)
        sums = {"kl": torch.zeros(()), "clipped": torch.zeros(())}

        def loss_of(chunk: dict[str, torch.Tensor]) -> torch.Tensor:
            logps = self._logps(chunk)
            old = chunk.get("old_logps", logps.detach())
            terms = token_terms(
                logps, old, chunk["advantages"], self.epsilon, self.epsilon_high, self.beta,
                chunk.get("ref_logps"),
            )  # fmt: skip
            keep = chunk["completion_mask"].bool()
            sums["clipped"] = sums["clipped"] + terms.clipped[keep].sum().detach().cpu()
            if terms.kl is not None:
                sums["kl"] = sums["kl"] + terms.kl[keep].sum().detach().cpu()
            total, count = loss_sum(terms.loss, chunk["completion_mask"], self.loss_type,
                                    self.max_new_tokens)  # fmt: skip
            return total / max(count, 1) * scale

        size = (lambda chunk: max(int(chunk["completion_mask"].sum()), 1)) if per_tokens else None
        loss = self.chunked_backward(rollout, loss_of, size)
        self._log_rollout(rollout, sums, loss.detach() / scale if scale else loss.detach())
        return loss

    def _log_rollout(
        self, rollout: dict[str, torch.Tensor], sums: dict[str, torch.Tensor], loss: torch.Tensor
    ) -> None:
        rows = rollout["completion_ids"].shape[0]
        tokens = max(int(rollout["completion_mask"].sum()), 1)
        scores = rollout["scores"]
        values = {
            "loss": loss,
            "reward": self._total(scores.cpu()).mean(),
            "reward_std": rollout["group_std"].mean(),
            "clip_fraction": sums["clipped"] / tokens,
            "completion_length": rollout["completion_mask"].sum(1).float().mean(),
        }
        if self.beta != 0.0:
            values["kl"] = sums["kl"] / tokens
        for j, reward in enumerate(self.rewards):
            values[f"reward_{reward.name}"] = scores[:, j].mean()
        for key, value in values.items():
            self.log(f"train/{key}", value.to(self.device), on_step=True, batch_size=rows,
                     prog_bar=key in ("loss", "reward"))  # fmt: skip

    def setup(self, stage: str) -> None:
        super().setup(stage)
        datamodule = getattr(self.trainer, "datamodule", None)
        repeat = int(getattr(datamodule, "repeat", 1))
        if stage == "fit" and repeat != self.num_iterations:
            raise ValueError(
                f"model.num_iterations={self.num_iterations} but data.repeat={repeat}: set "
                "data.repeat=${model.num_iterations} (conf/data/prompts.yaml does)"
            )
        if stage == "fit" and self.num_iterations > 1 and self.trainer.accumulate_grad_batches > 1:
            raise ValueError(
                f"model.num_iterations={self.num_iterations} reuses each rollout for whole "
                "optimizer steps, and this run accumulates "
                f"{self.trainer.accumulate_grad_batches} batches per step: set data.batch_size "
                "to the profile's micro batch (no accumulation), or model.num_iterations=1"
            )

    # ----- evaluation: mean total reward of greedy completions --------------------------------
    def _reward_of(self, batch: dict[str, Any], key: str) -> None:
        *_, scores = self._complete(batch, 1, None)
        total, *parts = self.held_out[key]
        total.update(self._total(scores).to(self.device))
        for j, metric in enumerate(parts):
            metric.update(scores[:, j].to(self.device))

    def _log_held_out(self, key: str) -> None:
        total, *parts = self.held_out[key]
        self._log_metric(key, total)
        for reward, metric in zip(self.rewards, parts, strict=True):
            self._log_metric(f"{key}_{reward.name}", metric)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._reward_of(batch, "val/reward")

    def on_validation_epoch_end(self) -> None:
        self._log_held_out("val/reward")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._reward_of(batch, "test/reward")
        with self.model.disable_adapter():
            self._reward_of(batch, "test/reward_base")

    def on_test_epoch_end(self) -> None:
        self._log_held_out("test/reward")
        self._log_held_out("test/reward_base")

    def _log_metric(self, key: str, metric: MeanMetric) -> None:
        if self.trainer.world_size == 1 and metric.weight == 0:  # type: ignore[operator]
            return
        value = metric.compute()  # a collective under DDP: every rank calls it
        metric.reset()
        self.log(key, value, prog_bar=key == "val/reward", sync_dist=True)

    # ----- checkpoints ------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Every rank's rollout buffer and use count: one ``all_gather_object`` per save under
        several processes (saving is a collective), each rank restoring its own."""
        super().on_save_checkpoint(checkpoint)
        rollout = {k: v.cpu() for k, v in (self._rollout or {}).items()}
        own = {"rollout": rollout, "rollout_uses": self._rollout_uses}
        ranks: list[Any] = [own]
        if self.trainer.world_size > 1:
            ranks = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(ranks, own)
        checkpoint[STATE_KEY] = {"ranks": ranks}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        ranks = checkpoint.get(STATE_KEY, {}).get("ranks")
        if not ranks:
            return
        # a run resumed on more processes than saved it: the extra ranks take rank 0's buffer
        saved = ranks[self.global_rank] if self.global_rank < len(ranks) else ranks[0]
        self._rollout = saved["rollout"] or None
        self._rollout_uses = int(saved["rollout_uses"])
