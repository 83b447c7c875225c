"""torch.distributed for the trainer: the rank group torchrun starts, FSDP2 sharding, collectives.

`torchrun --nproc-per-node N -m rollstream train ...` (or `rollstream train` with
`trainer.ranks` = N, which execs exactly that: `trainer.torchrun`) starts N ranks with
RANK / WORLD_SIZE / LOCAL_RANK set. `init_world` joins the process group: gloo on CPU,
NCCL on cuda devices (RCCL on ROCm builds), `trainer.dist_backend` to force one,
with `trainer.dist_timeout_s` as its timeout: gloo's default is 30 minutes, so a rank
that hangs (SIGSTOP, a deadlock) would stall the others that long; with the setting
their collective fails, they exit, and torchrun (which notices only exits) restarts
the group. Each rank also dies with torchrun (`trainer.torchrun.die_with_torchrun`, first
thing in `python -m rollstream`). WORLD_SIZE 1 (or no torchrun) is one plain process.

`shard_model` applies FSDP2 (`fully_shard` per decoder layer, then the root):
parameters, gradients and optimizer state are split across the ranks; each forward
all-gathers a layer's parameters, each backward reduce-scatters its gradients. The
reduction is a SUM (divide factor 1): the step divides every loss by the global
batch's denominators already (`trainer.data_parallel`). On CPU the all-gathers and
reduce-scatters run synchronously through `_TimedAllGather` / `_TimedReduceScatter`,
which add their wall time to the step's `comm_s` (on GPUs FSDP2's own asynchronous
collectives run, overlapped with compute, and `comm_s` stays 0: use the profiler).

`ProcessRanks` is `trainer.data_parallel.DataParallel` over the world: float64 sums,
object gathers, and the global gradient norm of the sharded (DTensor) gradients.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import nn

from trainer.settings import TrainerSettings
from trainer.torchrun import launched_by_torchrun

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place in the rank group: rank, size, its device and the control group
    (gloo: rank 0's commands travel on CPU whatever the compute backend)."""

    rank: int
    size: int
    local_rank: int
    device: torch.device
    backend: str = ""
    control: Any = None  # torch.distributed ProcessGroup, None at world 1
    local_peers: tuple[int, ...] = ()  # pids of the other ranks on this machine

    @property
    def leader(self) -> bool:
        return self.rank == 0


def process_group_backend(settings: TrainerSettings) -> str:
    if settings.dist_backend != "auto":
        return settings.dist_backend
    return "nccl" if settings.device.startswith("cuda") else "gloo"


def rank_device(settings: TrainerSettings, local_rank: int, size: int) -> torch.device:
    """cpu, or this rank's GPU (cuda:LOCAL_RANK) when the trainer runs on cuda with several ranks."""
    device = torch.device(settings.device)
    if size == 1 or device.type != "cuda":
        return device
    if device.index is not None:
        raise ValueError(
            f"trainer.device = {settings.device!r} names one GPU, but {size} ranks run: set trainer.device = "
            '"cuda" and each rank takes the GPU of its LOCAL_RANK'
        )
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def init_world(settings: TrainerSettings) -> World:
    """Join torchrun's process group (see the module docstring); world 1 when not under torchrun."""
    size = int(os.environ.get("WORLD_SIZE", "1")) if launched_by_torchrun() else 1
    if size == 1:
        return World(0, 1, 0, torch.device(settings.device))
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = rank_device(settings, local_rank, size)
    backend = process_group_backend(settings)
    timeout = timedelta(seconds=settings.dist_timeout_s)
    if not dist.is_initialized():
        store = _attempt_store(timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=size, timeout=timeout)
    control = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
    places: list[Any] = [None] * size
    dist.all_gather_object(places, (socket.gethostname(), os.getpid()), group=control)
    peers = tuple(pid for host, pid in places if host == socket.gethostname() and pid != os.getpid())
    log.info("rank %d of %d: pid %d, %s on %s", rank, size, os.getpid(), backend, device)
    return World(rank, size, local_rank, device, backend, control, peers)


def wake_peers(world: World) -> None:
    """SIGCONT the other ranks on this machine. Called by a rank that fails (a collective timed out
    on a stopped rank): torchrun then SIGTERMs the group and waits 30 s before SIGKILL, and a
    stopped process acts on neither; woken, it fails in its next collective and the restart
    comes at once."""
    for pid in world.local_peers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGCONT)


def _attempt_store(timeout: timedelta) -> Any:
    """torchrun's store under a prefix of this attempt (TORCHELASTIC_RESTART_COUNT): torchrun keeps one
    store server across restarts of the group, so without it a restarted rank can read a dead
    rank's gloo address from the attempt before and fail to connect."""
    store, _, _ = next(dist.rendezvous("env://", timeout=timeout))
    store.set_timeout(timeout)
    return dist.PrefixStore(f"rollstream/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def close_world(world: World) -> None:
    if world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()


def exit_finished_rank() -> NoReturn:
    """End a rank whose work is done and committed (versions, events, checkpoint): exit 0 now,
    without interpreter finalization. A gloo process group's C++ objects can outlive
    `destroy_process_group` (FSDP's modules and meshes hold references in cycles) and be freed
    during finalization, where gloo's teardown may abort the process (SIGABRT, `terminate called
    without an active exception`): torchrun counts that as a failed group and restarts it, and
    a restart budget spent on a finished run fails the run (seen once in CI, after the last step)."""
    gc.collect()  # free what can still be freed while the interpreter is whole
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class CommClock:
    """Wall seconds spent inside collectives, taken (and reset) once per step."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def timed(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - started

    def take(self) -> float:
        seconds, self.seconds = self.seconds, 0.0
        return seconds


class ProcessRanks:
    """`trainer.data_parallel.DataParallel` over torch.distributed's default group."""

    def __init__(self, world: World, clock: CommClock | None = None) -> None:
        self.world = world
        self.rank, self.size = world.rank, world.size
        self.clock = clock or CommClock()

    def sum(self, values: Sequence[float]) -> list[float]:
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.world.device)
        self.clock.timed(dist.all_reduce, tensor)
        return [float(v) for v in tensor.cpu().tolist()]

    def gather(self, value: T) -> list[T]:
        out: list[Any] = [None] * self.size
        self.clock.timed(dist.all_gather_object, out, value, group=self.world.control)
        return out

    def clip_grad_norm(self, parameters: Sequence[nn.Parameter], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
        full = getattr(norm, "full_tensor", None)  # a DTensor over FSDP2's shards
        return float(full() if full is not None else norm)

    def take_comm_s(self) -> float:
        return self.clock.take()


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers of a `PolicyModel` (LoRA-wrapped or not): FSDP2's units."""
    backbone = getattr(model, "model", None)
    layers = getattr(backbone, "layers", None)
    if layers is None:
        raise TypeError(f"{type(model).__name__} has no model.layers: FSDP2 wraps the policy model's layers")
    return list(layers)


def shard_model(model: nn.Module, ranks: ProcessRanks) -> None:
    """FSDP2 over the world: one unit per decoder layer and the root (embeddings, norm, head);
    gradients summed across ranks; collectives timed on CPU (module docstring)."""
    from torch.distributed.fsdp import fully_shard

    units = decoder_layers(model)
    for layer in units:
        fully_shard(layer)
    fully_shard(model)
    for unit in [*units, model]:
        unit.set_gradient_divide_factor(1.0)  # type: ignore[operator]
        unit.set_force_sum_reduction_for_comms(True)  # type: ignore[operator]
        if ranks.world.device.type == "cpu":
            unit.set_custom_all_gather(_TimedAllGather(ranks.clock))  # type: ignore[operator]
            unit.set_custom_reduce_scatter(_TimedReduceScatter(ranks.clock))  # type: ignore[operator]


def _comm_interfaces() -> tuple[type, type]:
    # The interfaces `FSDPModule.set_custom_all_gather` / `set_custom_reduce_scatter` take (torch >= 2.9).
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter

    return AllGather, ReduceScatter


_AllGather, _ReduceScatter = _comm_interfaces()


class _TimedAllGather(_AllGather):  # type: ignore[misc, valid-type]
    """FSDP2's all-gather, run synchronously and timed (CPU ranks)."""

    def __init__(self, clock: CommClock) -> None:
        self.clock = clock

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any, async_op: bool = False
    ) -> None:
        # Done before returning, so FSDP2 treats it as a synchronous op (no Work to wait for).
        self.clock.timed(dist.all_gather_into_tensor, output_tensor, input_tensor, group=group)


class _TimedReduceScatter(_ReduceScatter):  # type: ignore[misc, valid-type]
    """FSDP2's reduce-scatter, run synchronously and timed (CPU ranks)."""

    def __init__(self, clock: CommClock) -> None:
        self.clock = clock

    def allocate(self, size: Sequence[int], *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any,
        op: Any,
        async_op: bool = False,
    ) -> None:
        self.clock.timed(dist.reduce_scatter_tensor, output_tensor, input_tensor, op=op, group=group)
