"""How a step's batch is split across data-parallel ranks (pure), and what the step needs from them.

The split rule depends only on the batch, so every rank computes every rank's share
without asking anyone: a (mini-)batch's items are cut into `size` contiguous runs
balanced by tokens (`rank_of_items`: item i goes to the rank its token midpoint falls
in), then each rank packs its run into micro-batches of at most
`trainer.micro_batch_tokens` (`trainer.batch.micro_batches`). Every rank runs the same
number of micro-batches (`rank_micro_batches` pads the shorter plans with empty ones,
which the step runs as a one-row batch with no loss tokens: exactly zero gradient),
because FSDP2 all-gathers and reduce-scatters inside each forward and backward, so the
ranks' collectives must pair up. At world 1 the plan is the micro-batches of the
whole batch, as before data parallelism.

The loss of every micro-batch is divided by the denominators of the GLOBAL (mini-)
batch (`trainer.loss.Denominators`), and gradients are summed, not averaged, across
ranks; so world N takes the update world 1 takes, up to float summation order.

`DataParallel` is what `trainer.step` asks of the ranks: sums and gathers of metrics,
the global gradient norm and clip, and the time spent inside collectives. `SINGLE` is
one process; `trainer.distributed.ProcessRanks` is torch.distributed's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import torch
from torch import nn

from trainer.batch import HasTokens, micro_batches

Item = TypeVar("Item", bound=HasTokens)
T = TypeVar("T")


class DataParallel(Protocol):
    """This process's place among the ranks that split each batch, and their collectives."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def sum(self, values: Sequence[float]) -> list[float]:
        """Each value summed over the ranks (in float64), same answer on every rank."""
        ...

    def gather(self, value: T) -> list[T]:
        """Every rank's `value` (picklable), in rank order, on every rank."""
        ...

    def clip_grad_norm(self, parameters: Sequence[nn.Parameter], max_norm: float) -> float:
        """Clip the gradients of the whole model to `max_norm`; the global norm before clipping."""
        ...

    def take_comm_s(self) -> float:
        """Seconds spent inside the step's collectives since the last call (then reset)."""
        ...


class SingleProcess:
    """World 1: no collectives."""

    rank = 0
    size = 1

    def sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def gather(self, value: T) -> list[T]:
        return [value]

    def clip_grad_norm(self, parameters: Sequence[nn.Parameter], max_norm: float) -> float:
        return float(torch.nn.utils.clip_grad_norm_(list(parameters), max_norm))

    def take_comm_s(self) -> float:
        return 0.0


SINGLE = SingleProcess()


def rank_of_items(tokens: Sequence[int], size: int) -> list[int]:
    """The rank of each item: contiguous runs balanced by tokens (non-decreasing, a function of
    `tokens` and `size` only). Item i goes to the rank whose share of the total holds its
    token midpoint."""
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    total = sum(tokens)
    if total == 0:
        return [min(size - 1, i * size // max(len(tokens), 1)) for i in range(len(tokens))]
    ranks, before = [], 0
    for count in tokens:
        ranks.append(min(size - 1, (2 * before + count) * size // (2 * total)))
        before += count
    return ranks


def shares(items: Sequence[Item], size: int) -> list[list[Item]]:
    """Every rank's contiguous share of `items` (`rank_of_items`)."""
    out: list[list[Item]] = [[] for _ in range(size)]
    for item, rank in zip(items, rank_of_items([i.tokens for i in items], size), strict=True):
        out[rank].append(item)
    return out


def rank_micro_batches(items: Sequence[Item], rank: int, size: int, max_tokens: int) -> list[list[Item]]:
    """This rank's micro-batches of `items`, padded with empty ones to the longest rank's count
    (none at all when `items` is empty: then no rank runs a pass)."""
    if not items:
        return []
    plans = [micro_batches(share, max_tokens) for share in shares(items, size)]
    count = max(len(plan) for plan in plans)
    mine = plans[rank]
    return mine + [[] for _ in range(count - len(mine))]
