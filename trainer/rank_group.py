"""Rank 0 leads, the other ranks follow: one reader of the log, one writer of versions.

Rank 0 runs the trainer exactly as at world 1 (`trainer.loop.RlTrainer`,
`trainer.sft.SftTrainer`): it alone reads `groups` and `trajectories`, judges and
orders them, and alone writes versions, `weights`, `weights.history`, `trainer.steps`
and the checkpoint's manifest. Its backend is wrapped in `LeaderBackend`: before each
collective operation (a step, gathering the weights to publish, saving a checkpoint)
it broadcasts a `Command` naming it, with its inputs (the whole batch), then runs it;
every other rank runs `follow`, which executes the commands in the order they come.
Why not every rank reading the log itself: the order across partitions waits on
partition ends, which depends on fetch timing on a live log, so ranks reading
separately could form different batches; one reader also keeps one Kafka consumer
per trainer.

While rank 0 works alone (waiting for groups, writing a version, talking to Kafka),
the others wait inside a broadcast, under the process group's timeout
(`trainer.dist_timeout_s`); a keepalive thread sends them an empty command every
`trainer.dist_keepalive_s` of such quiet. Commands and keepalives share one lock, so a
keepalive never lands inside an operation's collectives. A keepalive that fails means
the group is broken (a rank died or hangs): rank 0 exits at once, and torchrun restarts
the group, which resumes from the last checkpoint and the log.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from trainer.backends import TrainBackend
from trainer.batch import TrainSample
from trainer.distributed import World, wake_peers
from trainer.step import SftSequence, StepMetrics

log = logging.getLogger(__name__)
EXIT_GROUP_BROKEN = 3  # rank 0's exit code when a keepalive fails (torchrun restarts the group)

Kind = Literal["wait", "rl_step", "sft_step", "gather", "save", "stop"]


@dataclass(frozen=True)
class Command:
    """What every rank does next; `step`: the step it belongs to; `items`: the step's whole batch;
    `path`: a checkpoint's state directory."""

    kind: Kind
    step: int = 0
    items: tuple[Any, ...] = ()
    path: str = ""


class Channel:
    """Commands from rank 0 to every rank (a broadcast on the world's gloo control group)."""

    def __init__(self, world: World) -> None:
        self.world = world

    def send(self, command: Command) -> None:
        dist.broadcast_object_list([command], src=0, group=self.world.control, device=torch.device("cpu"))

    def receive(self) -> Command:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.world.control, device=torch.device("cpu"))
        command = box[0]
        assert isinstance(command, Command)
        return command


class LeaderBackend:
    """Rank 0's `TrainBackend`: every collective operation announced to the followers first."""

    def __init__(self, backend: TrainBackend, channel: Channel, keepalive_s: float, step: int = 0) -> None:
        """`channel` to the followers; a keepalive after `keepalive_s` of quiet (module docstring);
        `step`: the steps trained before (a resumed run's), for the followers' logs."""
        self.inner, self.channel, self.keepalive_s, self.step = backend, channel, keepalive_s, step
        self._lock = threading.Lock()
        self._quiet_since = time.monotonic()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._keep_alive, name="rank-keepalive", daemon=True)
        self._thread.start()

    @property
    def state_kind(self) -> str:
        return self.inner.state_kind

    def rl_step(self, samples: Sequence[TrainSample]) -> StepMetrics:
        self.step += 1
        command = Command("rl_step", self.step, tuple(samples))
        return self._run(command, lambda: self.inner.rl_step(samples))

    def sft_step(self, sequences: Sequence[SftSequence]) -> StepMetrics:
        self.step += 1
        command = Command("sft_step", self.step, tuple(sequences))
        return self._run(command, lambda: self.inner.sft_step(sequences))

    def hf_state_dict(self, copy: bool = True) -> dict[str, torch.Tensor]:
        return self._run(Command("gather", self.step), lambda: self.inner.hf_state_dict(copy=copy))

    def save_state(self, directory: Path) -> list[dict[str, Any]]:
        command = Command("save", self.step, path=str(directory))
        return self._run(command, lambda: self.inner.save_state(directory))

    def load_state(self, directory: Path, rng: Sequence[dict[str, Any]]) -> None:
        self.inner.load_state(directory, rng)  # every rank loads at its start, before any command

    def close(self, *, stop_followers: bool = True) -> None:
        """Stop the keepalives; tell the followers to exit (not after a failure: they may be gone)."""
        self._closed.set()
        self._thread.join()
        if stop_followers:
            with self._lock:
                self.channel.send(Command("stop", self.step))

    def _run(self, command: Command, operation: Callable[[], Any]) -> Any:
        with self._lock:
            self.channel.send(command)
            try:
                return operation()
            finally:
                self._quiet_since = time.monotonic()

    def _keep_alive(self) -> None:
        poll = min(1.0, self.keepalive_s / 4)
        while not self._closed.wait(poll):
            if not self._lock.acquire(blocking=False):
                continue  # an operation runs: the followers are in it with rank 0
            try:
                if time.monotonic() - self._quiet_since >= self.keepalive_s and not self._closed.is_set():
                    self.channel.send(Command("wait"))
                    self._quiet_since = time.monotonic()
            except Exception as error:  # the group is broken: only a restart of all ranks mends it
                log.error("rank group broken (%s): exiting so torchrun restarts the group", error)
                wake_peers(self.channel.world)
                logging.shutdown()
                os._exit(EXIT_GROUP_BROKEN)
            finally:
                self._lock.release()


def follow(backend: TrainBackend, channel: Channel, pause_s: float = 0.0) -> int:
    """A follower rank: run rank 0's commands until it says stop; returns the steps trained.
    Each command but `wait` is logged as `phase=follow.<kind> step=<n> rank=<r>`, then
    `pause_s` slept (`trainer.phase_pause_s`, the kill tests' hook: rank 0 is inside the
    operation then, waiting for this rank)."""
    steps = 0
    while True:
        command = channel.receive()
        if command.kind == "wait":
            continue
        log.info("phase=follow.%s step=%d rank=%d", command.kind, command.step, channel.world.rank)
        if pause_s:
            time.sleep(pause_s)
        if command.kind == "stop":
            return steps
        if command.kind == "rl_step":
            backend.rl_step(command.items)
            steps += 1
        elif command.kind == "sft_step":
            backend.sft_step(command.items)
            steps += 1
        elif command.kind == "gather":
            backend.hf_state_dict()
        elif command.kind == "save":
            backend.save_state(Path(command.path))
