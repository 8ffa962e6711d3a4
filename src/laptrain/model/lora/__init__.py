"""The LoRA family: a pretrained causal LM with peft adapters (``causal_lm``), DPO on the same
model (``dpo``), the base weights' dtype (``base_dtype``: ``base_dtype: auto``, the entry's
``auto_settings``), ``laptrain doctor``'s LoRA check (``doctor``, the entry's ``doctor_check``),
the tiny offline Llama (``tiny_llama``) and the adapter folders a run leaves
(``adapter_folders``). Its sizing from the config alone and its commands stand on the floors
above: ``laptrain/preflight/lora_sizing.py``, ``laptrain/commands/lora_cli.py``."""
