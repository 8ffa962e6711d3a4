"""A merged LoRA fine-tune written as one GGUF file, with an Ollama Modelfile beside it.

Gap it fills: the ``gguf`` package has the file writer, the tensor-name map, the f16/q8_0/q4_0
quantisers and the tokenizer-file readers, but turning a transformers model into a file llama.cpp
loads is done by llama.cpp's ``convert_hf_to_gguf.py`` script, which is not part of any package.
This package does that step for the architecture the LoRA family fine-tunes (Llama: SmolLM2,
Llama 3.x), one concern per module:

- :mod:`.llama_tensors`: transformers tensor names and layout to GGUF's, and each tensor's type;
- :mod:`.llama_metadata`: the model's hyperparameters as GGUF keys (rope scaling included);
- :mod:`.vocab`: the tokenizer (tokens, types, merges, pre-tokenizer, special ids, chat template);
- :mod:`.modelfile`: the chat template in Ollama's template language, and the stop tokens;
- :mod:`.write`: the export itself (size check, temp file, fsync, rename).

docs/gguf_export.md has the format facts these rely on, with their sources.
"""
