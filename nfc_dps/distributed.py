"""This process's place under ``torchrun`` (RANK, WORLD_SIZE, LOCAL_RANK), shared by the benchmark
harness and ``nfc-dps restore``: gloo on CPU, NCCL on GPUs; a single process needs no process group.

Work is dealt over ranks by the callers (the harness by (task, image) job, ``restore`` by file);
this module only starts the group and moves small Python objects and values between ranks
(broadcast, gather, max, mean: no-ops in a single process).

What is torchrun's own: when any rank exits with a nonzero status, torchrun stops the other ranks
(SIGTERM), prints its ``ChildFailedError`` traceback and a table of each rank's exit code, and
exits 1 itself, whatever the ranks' statuses (2 for a usage error): read the status in that table
("exitcode : 2"), not torchrun's. What is ours: on a usage error every rank exits 2, rank 0 alone
says why, and it exits first (:func:`let_rank_0_report`), so torchrun names it as the root cause
and does not stop it before its message is out.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Dist", "init_distributed", "launch_rank", "let_rank_0_report", "reports_errors", "resolve_device",
           "shutdown"]

#: how long a rank other than 0 that refuses a run waits for torchrun to stop it once rank 0 has exited
RANK_0_GRACE_S = 10.0


def launch_rank() -> int:
    """This process's rank as ``torchrun`` set it (RANK; 0 outside torchrun or when unreadable),
    known before any process group starts."""
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def reports_errors() -> bool:
    """Whether this process prints usage errors: rank 0 only. Every rank of a torchrun group runs
    the same checks on the same flags (and the folder lock's answer is broadcast), so each refuses
    alike and exits 2; one message says why, not one per rank."""
    return launch_rank() == 0


def let_rank_0_report(status: int, grace_s: float | None = None) -> None:
    """Under a torchrun launcher, on a rank other than 0 that exits with ``status``: wait (at most
    ``grace_s``, default :data:`RANK_0_GRACE_S`) for rank 0, which runs the same checks and says
    why, to exit first; torchrun's SIGTERM ends the wait and this rank exits with ``status`` (not -15). A rank
    that exited first would have torchrun stop rank 0, possibly before its message. No-op outside
    torchrun (no TORCHELASTIC_RUN_ID), on rank 0 and off the main thread."""
    import signal
    import threading
    import time

    if launch_rank() == 0 or not os.environ.get("TORCHELASTIC_RUN_ID") or \
            threading.current_thread() is not threading.main_thread():
        return

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        time.sleep(RANK_0_GRACE_S if grace_s is None else grace_s)
    except Stopped:
        pass  # torchrun stops this rank: rank 0 has exited; this one returns its status
    finally:
        signal.signal(signal.SIGTERM, previous)


def shutdown() -> None:
    """Leave the process group, if one is up, before a refused run exits (not in the group's
    destructor at interpreter exit, which can abort the process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


@dataclass
class Dist:
    """Rank, world size, local rank, and whether a process group is up (world > 1)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    initialised: bool = False

    def barrier(self) -> None:
        """Wait for every rank (no-op in a single process)."""
        if self.initialised:
            import torch.distributed as dist

            dist.barrier()

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (a picklable Python object; no-op in a single process)."""
        if not self.initialised:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (picklable; [obj] in a single process)."""
        if not self.initialised:
            return [obj]
        import torch.distributed as dist

        box: list[Any] = [None] * self.world
        dist.all_gather_object(box, obj)
        return box

    def max(self, value: float, device: torch.device | str = "cpu") -> float:
        """The largest ``value`` over the ranks (``value`` itself in a single process); ``device``:
        where this rank's tensors live (NCCL reduces on the GPU)."""
        if not self.initialised:
            return float(value)
        import torch.distributed as dist

        t = torch.tensor([float(value)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        """The mean of tensor ``t`` over the ranks (``t`` itself in a single process)."""
        if not self.initialised:
            return t
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t)
        return t / self.world


def init_distributed(device: str) -> Dist:
    """Read RANK / WORLD_SIZE / LOCAL_RANK (torchrun); init gloo (CPU) or NCCL (CUDA) if WORLD_SIZE > 1."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    d = Dist(rank, world, local)
    if world > 1:
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = "nccl" if str(device).startswith("cuda") else "gloo"
            kwargs: dict[str, Any] = {"backend": backend, "timeout": datetime.timedelta(hours=48)}
            if backend == "nccl":
                torch.cuda.set_device(local)
                kwargs["device_id"] = torch.device("cuda", local)
            try:
                dist.init_process_group(**kwargs)
            except TypeError:  # older torch without device_id
                kwargs.pop("device_id", None)
                dist.init_process_group(**kwargs)
        d.initialised = True
    return d


def resolve_device(name: str, d: Dist) -> torch.device:
    """The device of ``name`` for this rank (auto: CUDA when available; a bare "cuda" is the rank's
    GPU, local_rank mod the GPU count)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda but CUDA is not available")
        return torch.device("cuda", d.local_rank % max(1, torch.cuda.device_count()))
    return torch.device(name)
