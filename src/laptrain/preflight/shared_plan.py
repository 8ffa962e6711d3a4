"""One preflight plan for the ranks that torchrun or srun start together.

torchrun and srun start every rank at once: each sized its own batch and DDP's collectives hung.
Rank 0 plans and broadcasts in the group the Trainer would make, which Lightning then uses
(lightning/fabric/utilities/distributed.py:273-277).
"""

from __future__ import annotations

import atexit
import os
import pickle
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

T = TypeVar("T")

RANK_0_NOTE = "the plan of rank 0 (broadcast to every rank), not measured on this rank"


def ranks_started_outside() -> Any | None:
    """Lightning's cluster environment when torchrun or srun started several ranks at once
    (detected in Lightning's order, pytorch/trainer/connectors/accelerator_connector.py:386-398),
    else None: one process, or ranks Lightning's own launcher starts (it sets neither
    ``TORCHELASTIC_RUN_ID`` nor ``SLURM_NTASKS``)."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    for environment_type in (TorchElasticEnvironment, SLURMEnvironment):
        if environment_type.detect():
            environment = environment_type()
            return environment if environment.world_size() > 1 else None
    return None


def group_options(strategy: Any, kind: str) -> tuple[str, timedelta]:
    """(backend, timeout) of the process group the Trainer's strategy would make: its own
    ``process_group_backend`` and ``timeout`` when the strategy config sets them, else Lightning's
    defaults: the device's default backend, nccl on CUDA and gloo on CPU
    (fabric/utilities/distributed.py:306-311), and 30 minutes (``default_pg_timeout``,
    pytorch/strategies/ddp.py:83)."""
    import torch.distributed
    from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout

    options = strategy if isinstance(strategy, Mapping) else {}
    backend = options.get("process_group_backend") or (
        torch.distributed.Backend.default_device_backend_map.get(kind, "gloo")
    )
    timeout = options.get("timeout")
    if isinstance(timeout, Mapping) and "_target_" in timeout:
        from hydra.utils import instantiate

        timeout = instantiate(timeout)
    return str(backend), timeout if isinstance(timeout, timedelta) else default_pg_timeout


def join_process_group(
    environment: Any, backend: str, timeout: timedelta, device_index: int | None
) -> None:
    """Start the default process group as Lightning's strategies would (``_init_dist_connection``,
    fabric/utilities/distributed.py:251-287, called with the strategy's ``device_id``,
    pytorch/strategies/ddp.py:198-207): rank and world size from the cluster environment, its
    address exported, bound to this rank's GPU on CUDA, destroyed at exit under NCCL."""
    import torch
    import torch.distributed

    if torch.distributed.is_initialized():
        return
    os.environ["MASTER_ADDR"] = environment.main_address
    os.environ["MASTER_PORT"] = str(environment.main_port)
    device = torch.device("cuda", device_index) if device_index is not None else None
    torch.distributed.init_process_group(
        backend,
        rank=environment.global_rank(),
        world_size=environment.world_size(),
        timeout=timeout,
        device_id=device,
    )
    if "nccl" in backend:
        # torch warns about an NCCL group left undestroyed at exit (as Lightning does: line 285-287)
        atexit.register(_destroy_process_group)


def _destroy_process_group() -> None:
    import torch.distributed

    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def rank_0_answer(plan: Callable[[], T]) -> T:
    """``plan()`` run on rank 0 alone, its answer on every rank: the value it returned, or the
    error it raised, raised on every rank, so that no rank waits for a plan that never comes and
    every rank exits with rank 0's one-line error. Needs the process group up."""
    import torch.distributed

    if torch.distributed.get_rank() != 0:
        box: list[Any] = [None]
        torch.distributed.broadcast_object_list(box, src=0)
        answer, error = box[0]
        if error is not None:
            raise error
        if hasattr(answer, "notes"):
            answer.notes.append(RANK_0_NOTE)
        return answer
    try:
        answer = plan()
    except Exception as error:
        torch.distributed.broadcast_object_list([(None, _sendable(error))], src=0)
        raise
    torch.distributed.broadcast_object_list([(answer, None)], src=0)
    return answer


def _sendable(error: Exception) -> Exception:
    """``error`` itself when it pickles (the ranks then raise the same class, e.g. PreflightError,
    which train.py reports in one line), else a RuntimeError with its message."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


def plan_on_rank_0(plan: Callable[[], T], strategy: Any, kind: str, device_index: int | None) -> T:
    """``plan()`` as every rank's answer: its own where Lightning starts the ranks (or there is
    one), rank 0's where torchrun or srun started them together."""
    environment = ranks_started_outside()
    if environment is None:
        return plan()
    backend, timeout = group_options(strategy, kind)
    join_process_group(environment, backend, timeout, device_index if kind == "cuda" else None)
    return rank_0_answer(plan)
