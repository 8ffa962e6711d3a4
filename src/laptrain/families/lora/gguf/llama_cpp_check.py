"""An exported GGUF checked in llama.cpp itself (``llama-cpp-python``, the ``llamacpp`` extra)
against the merged transformers model it came from.

Gap it fills: reading the file back with our own code, or with the ``gguf`` package that wrote it,
would not show what a llama.cpp user gets. Here llama.cpp loads the file, tokenizes each held-out
text with the file's tokenizer, and scores every position; the same token ids go through the
merged transformers model. Reported per file: whether the two tokenizers split alike, top-1 next
token agreement, the largest and the mean absolute difference of the log-probabilities, and the
perplexity of each. :func:`greedy_replies` puts the two models' greedy answers side by side, the
llama.cpp one formatted by llama-cpp-python from the chat template stored in the file.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

# Standard-library packages conf/data/stdlib_instructions.yaml does not list: never trained on.
HELD_OUT_MODULES = [
    "asyncio", "cmd", "colorsys", "compileall", "concurrent", "dbm", "dis", "enum", "filecmp",
    "fileinput", "graphlib", "hashlib", "importlib", "linecache", "multiprocessing", "numbers",
    "pickletools", "pkgutil", "plistlib", "pyclbr", "reprlib", "runpy", "sched", "secrets",
    "selectors", "sqlite3", "symtable", "timeit", "trace", "tracemalloc", "wave", "wsgiref",
    "xmlrpc", "zipapp",
]  # fmt: skip

QUESTIONS = [
    "What does `json.dumps` do?",
    "What does `shutil.copytree` do?",
    "What does `secrets.token_hex` do?",
]


@dataclass(frozen=True)
class Agreement:
    positions: int
    same_tokens: float  # fraction of texts llama.cpp tokenizes exactly as transformers does
    top1: float  # fraction of positions with the same most likely next token
    max_abs_logprob: float
    mean_abs_logprob: float
    ppl_llama_cpp: float
    ppl_transformers: float
    answer_ppl_llama_cpp: float  # over the answer tokens only (what the fine-tune was trained on)
    answer_ppl_transformers: float


def load_llama_cpp(path: Path, n_ctx: int = 512, threads: int | None = None) -> Any:
    try:
        from llama_cpp import Llama
    except ImportError:
        raise ValueError(
            "llama-cpp-python is not installed: pip install -e '.[llamacpp]' (it builds llama.cpp "
            "from source: cmake and a C++ compiler)"
        ) from None
    return Llama(
        model_path=str(path), n_ctx=n_ctx, logits_all=True, verbose=False, n_threads=threads
    )


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def compare(
    llm: Any, model: Any, tokenizer: Any, texts: list[str], answers_from: list[int] | None = None
) -> Agreement:
    """Score ``texts`` in llama.cpp (``llm``) and in ``model``; see :class:`Agreement`.
    ``answers_from``: per text, the number of leading tokens before its answer (the prompt)."""
    same = 0
    top1, diffs, nll_cpp, nll_hf, answer = [], [], [], [], []
    for index, text in enumerate(texts):
        ours = tokenizer(text, add_special_tokens=False)["input_ids"]
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        same += ours == theirs
        llm.reset()
        llm.eval(ours)
        cpp = _log_softmax(np.asarray(llm.scores[: len(ours)], dtype=np.float64))
        with torch.no_grad():
            logits = model(torch.tensor([ours])).logits[0].double()
        hf = torch.log_softmax(logits, dim=-1).numpy()[:, : cpp.shape[1]]
        top1.append(cpp.argmax(-1) == hf.argmax(-1))
        diffs.append(np.abs(cpp - hf).ravel())
        following = np.asarray(ours[1:])
        rows = np.arange(len(ours) - 1)
        nll_cpp.append(-cpp[rows, following])
        nll_hf.append(-hf[rows, following])
        start = answers_from[index] if answers_from else 1
        answer.append(rows + 1 >= start)
    diff = np.concatenate(diffs)
    cpp_nll, hf_nll, in_answer = (np.concatenate(x) for x in (nll_cpp, nll_hf, answer))
    return Agreement(
        positions=int(sum(len(t) for t in top1)),
        same_tokens=same / len(texts),
        top1=float(np.concatenate(top1).mean()),
        max_abs_logprob=float(diff.max()),
        mean_abs_logprob=float(diff.mean()),
        ppl_llama_cpp=math.exp(float(cpp_nll.mean())),
        ppl_transformers=math.exp(float(hf_nll.mean())),
        answer_ppl_llama_cpp=math.exp(float(cpp_nll[in_answer].mean())),
        answer_ppl_transformers=math.exp(float(hf_nll[in_answer].mean())),
    )


def greedy_replies(
    llm: Any, model: Any, tokenizer: Any, question: str, max_tokens: int = 48
) -> tuple[str, str]:
    """(llama.cpp's, transformers') greedy reply to ``question`` as a one-turn chat."""
    messages = [{"role": "user", "content": question}]
    llm.reset()
    done = llm.create_chat_completion(messages=messages, temperature=0.0, max_tokens=max_tokens)
    from_cpp = done["choices"][0]["message"]["content"] or ""
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
    from laptrain.families.lora.tools import end_of_turn_ids

    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=max_tokens,
            do_sample=False,
            eos_token_id=end_of_turn_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
        )
    from_hf = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    return from_cpp.strip(), from_hf.strip()


def held_out_texts(tokenizer, count: int) -> tuple[list[str], list[int]]:
    """Chat texts (question, answer) and, per text, the token count before its answer."""
    from laptrain.families.lora.stdlib_instructions import collect_pairs

    texts, starts = [], []
    for pair in collect_pairs(HELD_OUT_MODULES)[:count]:
        question = [{"role": "user", "content": pair["prompt"]}]
        answer = [{"role": "assistant", "content": pair["response"]}]
        texts.append(tokenizer.apply_chat_template(question + answer, tokenize=False))
        prompt = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
        starts.append(len(tokenizer(prompt, add_special_tokens=False)["input_ids"]))
    return texts, starts
