"""The LoRA family: a pretrained causal LM with peft adapters (``causal_lm``), the base weights'
dtype (``base_dtype``), the tiny offline Llama (``tiny_llama``) and the adapter tools
(``tools``: eval, generate, merge, export)."""
