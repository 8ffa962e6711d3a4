"""``laptrain predict DIR`` on a ``laptrain export --format onnx`` folder: onnxruntime runs
``model.onnx`` and the ``tokenizers`` library reads ``tokenizer/tokenizer.json``; torch is never
imported, so the command starts in a fraction of the time (docs/export.md)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from laptrain.commands.onnx_export import MODEL_FILE, ONNX_EXTRA

from .prediction import Prediction, check_batch_size


def is_onnx_export(folder: Path) -> bool:
    return (folder / MODEL_FILE).is_file()


class OnnxClassifier:
    """The ONNX model, tokenizer and label names of a classifier's ONNX export folder."""

    def __init__(self, folder: Path) -> None:
        try:
            import onnxruntime
        except ImportError:
            raise ValueError(f"{folder} is an ONNX export: running it needs {ONNX_EXTRA}") from None
        from tokenizers import Tokenizer

        tokenizer_dir = folder / "tokenizer"
        if (
            not (tokenizer_dir / "tokenizer.json").is_file()
            or not (folder / "labels.json").is_file()
        ):
            raise ValueError(
                f"{folder} has a {MODEL_FILE} but no tokenizer/tokenizer.json or labels.json: "
                "laptrain predict reads classifier exports (laptrain export RUN --format onnx)"
            )
        self.session = onnxruntime.InferenceSession(
            str(folder / MODEL_FILE), providers=["CPUExecutionProvider"]
        )
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.labels: list[str] = json.loads((folder / "labels.json").read_text())
        settings = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
        self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
        if settings.get("max_length"):  # the run's data.max_length, written by the export
            self.tokenizer.enable_truncation(int(settings["max_length"]))
        pad = settings.get("pad_token") or "[PAD]"
        self.tokenizer.enable_padding(pad_id=self.tokenizer.token_to_id(pad) or 0, pad_token=pad)

    def predict(self, texts: Sequence[str], batch_size: int = 32) -> list[Prediction]:
        """The most probable label of each text and its softmax probability."""
        import numpy as np

        check_batch_size(batch_size)
        out: list[Prediction] = []
        for start in range(0, len(texts), batch_size):
            encodings = self.tokenizer.encode_batch(list(texts[start : start + batch_size]))
            fields = {
                "input_ids": [e.ids for e in encodings],
                "attention_mask": [e.attention_mask for e in encodings],
                "token_type_ids": [e.type_ids for e in encodings],
            }
            feed = {name: np.array(fields[name], dtype=np.int64) for name in self.inputs}
            logits = self.session.run(None, feed)[0]
            probs = np.exp(logits - logits.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out += [
                Prediction(self.labels[int(i)], float(p[i]))
                for p, i in zip(probs, probs.argmax(-1))
            ]
        return out
