"""What the run and the callbacks may ask of one another, as Protocols: a callback joins by shape,
nothing here imports a concrete one. Also the state-version helper: a callback's state from
another laptrain resets with one warning instead of a ``KeyError`` mid-resume."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from lightning.pytorch.utilities import rank_zero_warn

if TYPE_CHECKING:
    import lightning.pytorch as pl


@runtime_checkable
class StopsRun(Protocol):
    """Stops the run on purpose and leaves it resumable; ``stop_reason`` is None until then, then a
    short word ("session", "swap")."""

    stop_reason: str | None


@runtime_checkable
class StopsOnSignal(Protocol):
    """Turns SIGINT/SIGTERM into a stop at a batch boundary; ``signal_received`` is the signal."""

    signal_received: int | None


@runtime_checkable
class EndsEarly(Protocol):
    """Ends a run as done before its epochs run out (early stopping, a pruned trial);
    ``ended_early`` is then the line that says where ("stopped early at epoch 5 (...)")."""

    ended_early: str | None


@runtime_checkable
class Reports(Protocol):
    """Contributes one section, ``report_section``, to the run report with ``summary()``."""

    report_section: str

    def summary(self) -> dict[str, Any]: ...


@runtime_checkable
class PlotsPoints(Protocol):
    """Adds fields (e.g. ``rss_mb``, ``thermal_state``) to each point of the report's plot."""

    def plot_point(self) -> dict[str, Any]: ...


@runtime_checkable
class SplitsMicroBatch(Protocol):
    """Owns the divisor applied to the micro-batch (more accumulation, same effective batch)."""

    chunk_divisor: int

    def set_chunk_divisor(self, divisor: int) -> None: ...


def stop_reason(callbacks: Iterable[object]) -> str | None:
    """Why a callback stopped the run on purpose (the first one that did), else None."""
    return next(
        (cb.stop_reason for cb in callbacks if isinstance(cb, StopsRun) and cb.stop_reason), None
    )


def signal_stop(callbacks: Iterable[object]) -> int | None:
    """The signal number a callback stopped the run for (SIGINT, SIGTERM), else None."""
    return next(
        (
            cb.signal_received
            for cb in callbacks
            if isinstance(cb, StopsOnSignal) and cb.signal_received is not None
        ),
        None,
    )


def stop_requested(trainer: pl.Trainer) -> bool:
    """A stop was asked for: by Lightning's flag or a signal seen by laptrain's ``GracefulStop``."""
    return trainer.should_stop or signal_stop(trainer.callbacks) is not None


def ended_early(callbacks: Iterable[object]) -> str | None:
    """Where a callback ended the run as done before its epochs ran out, else None."""
    return next(
        (cb.ended_early for cb in callbacks if isinstance(cb, EndsEarly) and cb.ended_early), None
    )


def report_sections(callbacks: Iterable[object]) -> dict[str, dict[str, Any]]:
    """Every reporting callback's ``summary()`` under its section name (the first one per name)."""
    sections: dict[str, dict[str, Any]] = {}
    for cb in callbacks:
        if isinstance(cb, Reports) and cb.report_section not in sections:
            sections[cb.report_section] = cb.summary()
    return sections


def cooling_s(callbacks: Iterable[object]) -> float:
    """Seconds spent in breaks so far (a callback's ``cooling_s``: cooling breaks, pauses on
    battery; not training time), read as an attribute: ``isinstance`` against a runtime Protocol
    costs ~15 us per callback (benchmarks/overhead.py)."""
    total = 0.0
    for cb in callbacks:
        seconds = getattr(cb, "cooling_s", None)
        if isinstance(seconds, int | float):
            total += seconds
    return total


class StateVersionWarning(UserWarning):
    """A callback's checkpoint state has another version than this laptrain writes; it was reset."""


def check_version(name: str, state: Mapping[str, Any], expected: int, resets: str) -> bool:
    """Whether ``state`` (a callback's checkpointed ``state_dict``) has version ``expected``; else
    one warning naming the callback and what it ``resets``, and False."""
    found = state.get("version")
    if found == expected:
        return True
    rank_zero_warn(
        f"{name}: checkpoint state has version {found!r}, this laptrain reads version {expected}; "
        f"not loaded, reset instead: {resets}",
        category=StateVersionWarning,
    )
    return False


class VersionedState:
    """A callback's checkpointed state, with its layout version: Lightning hands a saved
    ``state_dict`` back as it is, so an older layout would fill the wrong fields or raise KeyError
    mid-resume. A subclass (before ``Callback``) defines :meth:`saved_state`, :meth:`restore_state`
    and :meth:`reset_state`; the version check and its warning are here."""

    STATE_VERSION = 1
    STATE_NAME = "callback"  # the callback's config name, in the warning
    STATE_RESETS = "its state"  # what is reset instead of loaded, in the warning

    def saved_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def restore_state(self, state: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def reset_state(self) -> None:
        """What a checkpoint of another version leaves (default: the state as constructed)."""

    def state_dict(self) -> dict[str, Any]:
        return {"version": self.STATE_VERSION, **self.saved_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if check_version(self.STATE_NAME, state_dict, self.STATE_VERSION, self.STATE_RESETS):
            self.restore_state(state_dict)
        else:
            self.reset_state()


@runtime_checkable
class BackPropagatesInChunks(Protocol):
    """A module whose ``training_step`` back-propagates range by range (``ChunkedBackward``)."""

    def chunked_backward(self, batch: Any, loss_fn: Any, size_fn: Any = None) -> Any: ...
