"""The LoRA family: a pretrained causal LM with peft adapters (``causal_lm``), DPO on the same model
(``dpo``), GRPO (``grpo``, ``grpo_loss``, ``grpo_rewards``, ``grpo_sampling``), instruction,
preference and prompt data (``instructions``, ``instruction_rows``, ``preferences``,
``preference_rows``, ``prompts``, ``prompt_rows``, ``chat_tokenizer``, ``stdlib_instructions``), the base
weights' dtype (``base_dtype``: ``base_dtype: auto``), the memory forecast from the config alone
(``sizing``), ``laptrain doctor``'s LoRA check (``doctor``), the tiny offline Llama
(``tiny_llama``), the adapter folders a run leaves (``adapter_folders``), its commands
(``commands``: export, generate, eval; their work in ``tools`` and ``preference_eval``), the GGUF
export (``gguf/``) and input source (``gguf_source``), ``laptrain why``'s DPO rule
(``why_rules``) and the smoke build (``smoke``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from laptrain.families.classifier import transformers_fsdp_layers
from laptrain.family import Family, FileRules


def _refuse_precision(kind: str, precision: str) -> str | None:
    from laptrain.families.lora.causal_lm import refuse_precision

    return refuse_precision(kind, precision)


def _sizing(cfg: Any, model_cfg: Any) -> tuple[list[str], bool]:
    from laptrain.families.lora.sizing import report

    return report(cfg, model_cfg)


def _auto_settings(*args: Any, **kwargs: Any) -> dict[str, Any]:
    from laptrain.families.lora.base_dtype import resolve_auto_base_dtype

    return resolve_auto_base_dtype(*args, **kwargs)


def _doctor_check(profile: Mapping[str, Any]) -> Any:
    from laptrain.families.lora.doctor import check_training

    return check_training(profile)


def _file_rules(datamodule: str) -> FileRules | None:
    from laptrain.families.lora.instruction_rows import INSTRUCTION_OPTIONS, check_instructions
    from laptrain.families.lora.preference_rows import check_preferences
    from laptrain.families.lora.prompt_rows import PROMPT_OPTIONS, check_prompts

    if datamodule == "PromptDataModule":
        return FileRules(PROMPT_OPTIONS, check_prompts)
    rules = {
        "InstructionDataModule": check_instructions,
        "PreferenceDataModule": check_preferences,
    }.get(datamodule)
    return None if rules is None else FileRules(INSTRUCTION_OPTIONS, rules)


def _commands() -> Any:
    from laptrain.families.lora import commands

    return commands


def _why(series: Any) -> list[Any]:
    from laptrain.families.lora.why_rules import dpo_likelihood_fall

    return dpo_likelihood_fall(series)


def _smoke() -> Any:
    from laptrain.families.lora import smoke

    return smoke


def _model_files() -> Mapping[str, Any]:
    from laptrain.families.lora.gguf_source import convert_gguf

    return {".gguf": convert_gguf}


FAMILY = Family(
    name="lora",
    summary="a pretrained causal LM fine-tuned with peft LoRA adapters on instruction pairs",
    refuse_precision=_refuse_precision,
    sizing=_sizing,
    auto_settings=_auto_settings,
    doctor_check=_doctor_check,
    file_rules=_file_rules,
    fsdp_layers=transformers_fsdp_layers,
    commands=_commands,
    why=_why,
    exports=_commands,
    smoke=_smoke,
    model_files=_model_files,
)
