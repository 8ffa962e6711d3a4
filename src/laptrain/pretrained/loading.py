"""Loading a pretrained model, tokenizer or config from any ``model.pretrained`` source
(``laptrain.pretrained.sources``): every load goes through here, so a failure is one line and a
load prints one line (source, class, parameters, dtype, seconds, cached or not) instead of
transformers' load report."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from laptrain.console import exception_chain

T = TypeVar("T")
Source = str | os.PathLike[str] | Mapping[str, Any]


def say_line(line: str) -> None:
    from lightning.pytorch.utilities import rank_zero_info

    rank_zero_info(line)


def describe_source(source: Source) -> str:
    """A short name for ``source``: the wheel's package and member, or the path / hub name."""
    if isinstance(source, Mapping):
        return f"{source.get('package')}:{Path(str(source.get('member'))).name}"
    return os.fspath(source)


def needs_resolving(source: Source) -> bool:
    """A wheel member or a file a family converts (a ``.gguf``): transformers cannot load these as
    they are."""
    from laptrain.pretrained.sources import file_converters

    if isinstance(source, Mapping):
        return True
    return Path(os.fspath(source).strip()).suffix.lower() in file_converters()


def resolve(source: Source, check: bool = True) -> tuple[str, bool]:
    """(what transformers should load, whether it was fetched or converted just now); with ``check``
    a folder must hold ``config.json`` and a path must exist, without it (a tokenizer) they pass."""
    from laptrain.pretrained.sources import resolve_pretrained

    if not check and not needs_resolving(source):
        return os.fspath(source), False

    steps: list[str] = []

    def say(line: str) -> None:
        steps.append(line)
        say_line(line)

    from laptrain.console import no_transformers_bars

    with no_transformers_bars():  # dequantising and saving draw a bar per step
        local = resolve_pretrained(source, say=say)
    assert local is not None
    return local, bool(steps)


def _loaded(load: Callable[[str], T], local: str, source: Source, what: str, fix: str) -> T:
    try:
        return load(local)
    except (OSError, RuntimeError) as err:
        folder = Path(local).exists()
        # huggingface_hub 1.x raises "Cannot send a request, as the client has been closed"
        # for a hub name under HF_HUB_OFFLINE=1; a folder's RuntimeError is a real one
        if isinstance(err, RuntimeError) and folder:
            raise
        name = describe_source(source)
        refused = None if folder else hub_refusal(err, name)
        if refused:  # the hub answered: the name is wrong, gated, private, or the token is
            raise OSError(
                f"cannot load {what} {name!r} from the hub: {refused}; or {fix}"
            ) from None
        where = "folder" if folder else "hub name (offline?)"
        raise OSError(
            f"cannot load {what} {name!r} as a {where}: {fix} ({err.__class__.__name__})"
        ) from None


def hub_refusal(err: BaseException, name: str) -> str | None:
    """What the hub's answer behind ``err`` means, with its fix (None: no answer from the hub).
    transformers re-raises hub errors as ``OSError(...) from e`` (transformers/utils/hub.py), so the
    chain is searched for huggingface_hub's ``GatedRepoError``, ``RepositoryNotFoundError`` (also a
    private or gated repo without a login: 401) and ``HfHubHTTPError`` (401, 403) (huggingface_hub/
    errors.py); docs/model_sources.md."""
    try:
        from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    except ImportError:
        return None
    seen = exception_chain(err)
    page = f"https://huggingface.co/{name}"
    for current in seen:
        if isinstance(current, GatedRepoError):
            return (
                f"it is gated: accept the licence on the model page ({page}) with your account, "
                "then `hf auth login` (or set HF_TOKEN) on this machine"
            )
        if isinstance(current, RepositoryNotFoundError):
            return (
                f"the hub has no repo {name!r} that this login may see: check the name on {page}, "
                "or, for a private or gated repo, `hf auth login` with an account that has access"
            )
    for current in seen:
        status = getattr(getattr(current, "response", None), "status_code", None)
        if isinstance(current, HfHubHTTPError) and status == 401:
            return (
                f"the hub refused the token for {name!r} (HTTP 401): `hf auth login` again, "
                "or unset a stale HF_TOKEN"
            )
        if isinstance(current, HfHubHTTPError) and status == 403:
            return (
                f"the token may not read {name!r} (HTTP 403): `hf auth login` with a token that "
                "has read access to it"
            )
    return None


def from_pretrained(load: Callable[[str], T], source: Source, what: str, fix: str) -> T:
    """``load`` of the folder or hub name ``source`` resolves to; an OSError becomes one line
    saying whether a folder or a hub name failed (gated, not found or unauthorised when the hub
    said so: :func:`hub_refusal`; else perhaps offline), and ``fix``."""
    local, _ = resolve(source, check=False)
    return _loaded(load, local, source, what, fix)


@contextmanager
def quiet_load_report() -> Iterator[None]:
    """transformers' load report (missing / unexpected keys, a multi-line table) held back; the
    caller prints one line from ``output_loading_info`` instead."""
    # transformers' own root logger: raising the level of ``transformers.modeling_utils`` itself
    # would make 5.x run its tensor-parallel plan check, which warns on every plain load
    # (transformers/modeling_utils.py: ``if logger.level >= logging.WARNING: verify_tp_plan``).
    from laptrain.console import logger_level

    with logger_level("transformers", logging.ERROR):
        yield


def load_pretrained_model(load: Callable[..., Any], source: Source, fix: str) -> Any:
    """``load(local, output_loading_info=True)`` with one console line for the load and one for
    weights the checkpoint did not have (e.g. a new classifier head)."""
    local, fetched = resolve(source)
    from laptrain.console import no_transformers_bars

    start = time.perf_counter()
    with quiet_load_report(), no_transformers_bars():
        model, info = _loaded(partial(load, output_loading_info=True), local, source, "model", fix)
    seconds = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    note = "fetched and converted just now" if fetched else "cached"
    if not isinstance(source, Mapping) and local == os.fspath(source):
        note = "hub" if not Path(local).exists() else "folder"
    say_line(
        f"pretrained: {describe_source(source)} -> {type(model).__name__}, "
        f"{params / 1e6:.1f} M parameters, {dtype}, loaded in {seconds:.1f} s ({note})"
    )
    missing = list(info.get("missing_keys") or [])
    if missing:
        shown = ", ".join(sorted(missing)[:4]) + (", ..." if len(missing) > 4 else "")
        say_line(
            f"pretrained: {len(missing)} new tensors initialised (not in the checkpoint): {shown}"
        )
    return model
