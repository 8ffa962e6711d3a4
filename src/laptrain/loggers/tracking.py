"""MLflow and W&B beside TensorBoard: what the job adds to Lightning's loggers (docs/loggers.md).

No login prompt (W&B offline without a key), no telemetry, MLflow's artifacts beside its SQLite
store, a W&B run ended with its job (WandbLogger reuses ``wandb.run`` across a sweep), and only
global rank 0 builds them (every rank migrating the store at once killed one with
``OperationalError``).
"""

from __future__ import annotations

import contextlib
import netrc
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from omegaconf import DictConfig, OmegaConf

from laptrain.config.errors import ConfigError
from laptrain.loggers import continued_runs

# Set unless the user set them: nothing leaves the machine that the user did not ask to send.
QUIET_ENV = {"MLFLOW_DISABLE_TELEMETRY": "true", "WANDB_ERROR_REPORTING": "false"}
WANDB_HOST = "https://api.wandb.ai"
ONLINE = ("online", "run")  # "run": wandb's older name for online


def quiet_env(environ: dict[str, str] | os._Environ = os.environ) -> None:
    """:data:`QUIET_ENV` where unset, before mlflow is imported (it reads its telemetry switch
    then)."""
    for key, value in QUIET_ENV.items():
        environ.setdefault(key, value)


def wandb_key_found(environ: Mapping[str, str] = os.environ, home: Path | None = None) -> bool:
    """Whether wandb will find credentials without asking: ``WANDB_API_KEY``, an identity token
    file, or a netrc entry (``NETRC``, else ``~/.netrc`` / ``~/_netrc``) for ``WANDB_BASE_URL``'s
    host, as ``wandb login`` writes it."""
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(environ.get("WANDB_BASE_URL") or WANDB_HOST).hostname or ""
    home = home if home is not None else Path(environ.get("HOME") or Path.home())
    files = [Path(environ["NETRC"])] if environ.get("NETRC") else [home / ".netrc", home / "_netrc"]
    for path in files:
        try:
            if path.is_file() and netrc.netrc(str(path)).authenticators(host):
                return True
        except (OSError, netrc.NetrcParseError):
            continue
    return False


def wandb_mode(
    configured: str | None,
    environ: Mapping[str, str] = os.environ,
    home: Path | None = None,
    where: str = "logger.wandb",
) -> str:
    """The mode W&B runs in: ``configured`` (``logger.wandb.mode``), else ``WANDB_MODE``, else
    online when a key is found and offline otherwise. Raises :class:`ConfigError` (one line) for
    online without a key, where wandb would prompt."""
    mode = configured or environ.get("WANDB_MODE") or ""
    key = wandb_key_found(environ, home)
    if not mode:
        return "online" if key else "offline"
    if mode in ONLINE and not key:
        said = f"{where}.mode={mode}" if configured else f"WANDB_MODE={mode}"
        raise ConfigError(
            f"{said} asks for W&B online, but no W&B API key was found (WANDB_API_KEY, or "
            "`wandb login`); set one, or leave the mode unset to log offline"
        )
    return mode


def check_wandb_modes(section: Any, environ: Mapping[str, str] = os.environ) -> None:
    """:func:`wandb_mode`'s refusal before the run folder is made (laptrain.config.check, without
    torch): W&B loggers are known by their ``_target_``'s class name."""
    for name, node in continued_runs.entries(section):
        if str(node.get("_target_")).rsplit(".", 1)[-1] == "WandbLogger":
            configured = "offline" if node.get("offline") else node.get("mode")
            wandb_mode(configured, environ, where=f"logger.{name}")


def prepared(
    section: Any,
    folder: Path,
    environ: dict[str, str] | os._Environ = os.environ,
    tracked: bool = True,
) -> DictConfig | None:
    """The ``logger`` section as the job builds it: resolved, with the run folder's MLflow / W&B ids
    (laptrain.loggers.continued_runs), W&B's mode decided, MLflow's artifacts beside its store;
    without them unless ``tracked`` (global rank 0). Exports :data:`QUIET_ENV` first."""
    if not section:
        return None
    quiet_env(environ)
    built = OmegaConf.create(OmegaConf.to_container(section, resolve=True))
    continued_runs.with_stored_ids(built, folder)
    for name, node in list(continued_runs.entries(built)):
        kind = continued_runs.kind_of(node)
        if kind is not None and not tracked:
            del built[name]
        elif kind == "wandb":
            configured = "offline" if node.get("offline") else node.get("mode")
            node.mode = wandb_mode(configured, environ, where=f"logger.{name}")
            node.offline = False  # True would set WANDB_MODE=dryrun for the whole process
        elif kind == "mlflow" and node.get("artifact_location") is None:
            store = local_store(node.get("tracking_uri"))
            if store is not None:
                node.artifact_location = str(store.parent / "mlflow-artifacts")
    return built


def local_store(uri: str | None) -> Path | None:
    """The database file of a local SQLite MLflow store (``sqlite:///<path>``), else None (a
    server; a ``file:`` store keeps its artifacts inside itself already)."""
    if uri and uri.startswith("sqlite:///"):
        return Path(uri.removeprefix("sqlite:///"))
    return None


def remember(section: Any, loggers: list[Any], folder: Path) -> None:
    """Keep the ids of the MLflow / W&B runs ``loggers`` started, so that a resume continues them
    (rank 0 only; starts the runs if they have not started)."""
    continued_runs.remember(section, loggers, folder)


def log_text(loggers: list[Any], values: Mapping[str, str]) -> None:
    """Text values for the trackers that keep them: tags of the MLflow run, the W&B run's
    summary. Other loggers (TensorBoard, CSV) take numbers only and are left out."""
    from lightning.pytorch.loggers import MLFlowLogger, WandbLogger

    for logger in loggers:
        if isinstance(logger, MLFlowLogger):
            for key, value in values.items():
                logger.experiment.set_tag(logger.run_id, key, str(value))
        elif isinstance(logger, WandbLogger):
            logger.experiment.summary.update({k: str(v) for k, v in values.items()})


@contextlib.contextmanager
def runs_ended() -> Iterator[None]:
    """End the W&B run the job started when the job ends (exit code 1 if it raised)."""
    failed = True
    try:
        yield
        failed = False
    finally:
        wandb = sys.modules.get("wandb")
        if wandb is not None and getattr(wandb, "run", None) is not None:
            wandb.finish(exit_code=1 if failed else 0)
