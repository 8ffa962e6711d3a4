"""``laptrain export RUN --format onnx``: a run's module as one ONNX graph that onnxruntime runs
on any OS without torch (docs/export.md). Any LightningModule (a user's own has no family) is
exported from the run's best checkpoint with its ``example_input_array``, or one batch of its
datamodule; a family may export its own way (the classifier: tokenizer and labels beside the
model) through :func:`write_onnx`.

torch.export's exporter (``dynamo=True``), not the TorchScript tracer, which fixed the tiny BERT's
mask shapes at the traced size (logits off by up to 1e-2 at other sizes; torch.export: 7e-9).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import inspect
import io
import json
import logging
import warnings
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from laptrain.commands.export_folder import export_target

ONNX_EXTRA = 'pip install -e ".[onnx]"'
MODEL_FILE = "model.onnx"
QUANTS = (
    "int8",
)  # onnxruntime's dynamic quantizer: int8 weights per channel, activations per call


def check_onnx(quant: str | None) -> None:
    """One-line ValueError: an unknown ``--quant``, or the onnx extra not installed."""
    if quant not in (None, *QUANTS):
        raise ValueError(
            f"--quant {quant}: --format onnx takes --quant int8 (onnxruntime's dynamic "
            "quantizer), or no --quant for float32"
        )
    missing = [n for n in ("onnx", "onnxruntime", "onnxscript") if not importlib.util.find_spec(n)]
    if missing:
        raise ValueError(f"--format onnx needs {', '.join(missing)}: {ONNX_EXTRA}")


def _at_least_two(value: Any, axes: Collection[int]) -> Any:
    """``value`` doubled along each of ``axes`` of size 1: torch.export makes a size-1 axis a
    constant, so an example of batch 1 would give a graph of batch 1 only."""
    for axis in axes:
        if value.shape[axis] == 1:
            import torch

            value = torch.cat([value, value], dim=axis)
    return value


def _export(
    model: Any, example: dict[str, Any], shapes: dict[str, Any], output_names: list[str] | None
) -> Any:
    """torch.onnx.export's program, its logs, prints and warnings held back (graph dumps, notes
    on axis names); a failure is one line: its innermost cause and the fix."""
    import torch

    torch_logs = logging.getLogger("torch")
    level = torch_logs.level
    torch_logs.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            return torch.onnx.export(
                model,
                (),
                kwargs=example,
                dynamo=True,
                dynamic_shapes=shapes,
                output_names=output_names,
                verbose=False,
            )
    except Exception as err:  # torch.export's and onnxscript's errors, each its own type
        while err.__cause__ is not None:
            err = err.__cause__  # type: ignore[assignment]
        reason = next((line for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ValueError(
            f"{type(model).__name__}.forward cannot be exported to ONNX ({reason.strip()[:300]}): "
            "set example_input_array to an input forward takes, with no Python branch on "
            "tensor values"
        ) from None
    finally:
        torch_logs.setLevel(level)


def write_onnx(
    model: Any,
    inputs: Mapping[str, Any],
    folder: Path,
    quant: str | None = None,
    output_names: list[str] | None = None,
) -> float:
    """``model(**inputs)`` as ``folder/model.onnx``: axis 0 of every input dynamic (batch), and
    axis 1 of integer inputs (token ids, masks: sequence); with ``quant="int8"`` its weights
    quantized. Returns the max |Δ| between onnxruntime's and torch's outputs on ``inputs``; a
    ValueError (one line) when torch.export cannot export the forward."""
    import numpy as np
    import onnxruntime
    import torch

    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    shapes, example = {}, {}
    for name, value in inputs.items():
        ids = not value.is_floating_point() and value.dim() >= 2
        shapes[name] = {0: batch, 1: sequence} if ids else {0: batch}
        example[name] = _at_least_two(value, shapes[name])
    model = model.eval()
    program = _export(model, example, shapes, output_names)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / MODEL_FILE
    program.save(str(path))
    if quant == "int8":
        from onnxruntime.quantization import QuantType, quantize_dynamic

        float32 = folder / "float32.onnx"
        path.rename(float32)
        # per channel: MiniLM's int8 test accuracy 0.5 points under float32, 1.4 per tensor
        logging.disable(logging.WARNING)  # "consider to run pre-processing", on the root logger
        try:
            quantize_dynamic(float32, path, weight_type=QuantType.QInt8, per_channel=True)
        finally:
            logging.disable(logging.NOTSET)
        float32.unlink()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.inference_mode():
        expected = model(**example)
    expected = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    got = session.run(None, {k: v.numpy() for k, v in example.items()})
    return max(float(np.abs(g - e.numpy()).max()) for g, e in zip(got, expected))


def _forward_inputs(module: Any, sample: Any) -> dict[str, Any]:
    """An example input (a tensor, a tuple of them, a dict; a batch's inputs: its first item, or
    the keys forward takes) as forward's keyword arguments."""
    names = list(inspect.signature(module.forward).parameters)
    if isinstance(sample, Mapping):
        return {k: v for k, v in sample.items() if k in names}
    values = sample if isinstance(sample, (tuple, list)) else (sample,)
    return dict(zip(names, values))


def _example_input(module: Any, cfg: Any) -> dict[str, Any]:
    """``module.example_input_array``, else the inputs of one training batch of the run's
    datamodule (a ``(x, y)`` batch's ``x``), as forward's keyword arguments."""
    if module.example_input_array is not None:
        return _forward_inputs(module, module.example_input_array)
    from laptrain.config.batch_request import batch_request
    from laptrain.job.datamodule_settings import build_datamodule

    datamodule = build_datamodule(cfg.data, batch_request(cfg).follows_profile)
    datamodule.prepare_data()
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))
    return _forward_inputs(module, batch[0] if isinstance(batch, (tuple, list)) else batch)


def best_checkpoint_of(run: Path) -> Path:
    """The run's best checkpoint (report.json names it), else its last one."""
    from laptrain.checkpoints.last import run_last_checkpoint

    report = run / "report.json"
    best = (json.loads(report.read_text()).get("checkpoint") or {}) if report.is_file() else {}
    return Path(best["best"]) if best.get("best") else run_last_checkpoint(run)


def load_run_module(run: Path) -> tuple[Any, Any, Path]:
    """The run's module, built from its config with the weights of its best checkpoint, the
    config and that checkpoint; one-line errors."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from laptrain.checkpoints.checkpoint_io import read_checkpoint
    from laptrain.checkpoints.trusted import trusted_globals
    from laptrain.config.check import LAPTRAIN_KEYS
    from laptrain.run_folder.naming import register_resolvers

    config = run / ".hydra" / "config.yaml"
    if not config.is_file():
        raise ValueError(f"{run} is not a run folder (no .hydra/config.yaml): give a run folder")
    register_resolvers()
    cfg = OmegaConf.load(config)
    model_cfg = OmegaConf.to_container(cfg.model, resolve=True)
    for key in LAPTRAIN_KEYS:
        model_cfg.pop(key, None)
    checkpoint = best_checkpoint_of(run)
    try:  # Hydra's errors wrap the import's or the constructor's
        trusted = trusted_globals([cfg.model, cfg.data])
        state = read_checkpoint(checkpoint, trusted)
        sized = {
            k: v for k, v in (state.get("hyper_parameters") or {}).items() if k not in model_cfg
        }
        module = instantiate(model_cfg, _convert_="all", **sized)  # + the datamodule's sizes
    except (ImportError, InstantiationException) as err:
        cause = str(err.__cause__ or err).strip().splitlines()[0]
        raise ValueError(
            f"cannot build {model_cfg.get('_target_')} of {run} ({cause}): run laptrain export "
            "where train.py ran it (its folder on PYTHONPATH)"
        ) from None
    module.load_state_dict(state["state_dict"])
    return module, cfg, checkpoint


def default_out(run: Path, quant: str | None) -> Path:
    """``--out``'s default: ``<run>/onnx``, or ``<run>/onnx-int8``."""
    return run / ("onnx" if quant is None else f"onnx-{quant}")


def export_module(args: argparse.Namespace) -> int:
    """``laptrain export RUN --format onnx`` of any LightningModule run: ``model.onnx``."""
    check_onnx(args.quant)
    from laptrain.console import quiet_libraries

    quiet_libraries()
    module, cfg, checkpoint = load_run_module(args.path)
    inputs = _example_input(module, cfg)
    out = args.out or default_out(args.path, args.quant)
    differs: list[float] = []
    export_target(out, "onnx", (checkpoint,), args.force).write(
        lambda folder: differs.append(write_onnx(module, inputs, folder, args.quant))
    )
    print(f"ONNX written to {out} (max |Δ| vs torch on the example input: {differs[0]:.2g})")
    return 0
