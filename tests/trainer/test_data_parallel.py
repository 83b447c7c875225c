"""Data parallelism: the split rule, and 2 FSDP2 ranks (gloo, torchrun) taking world 1's updates.

The torchrun test runs `tests.trainer.data_parallel_runs` on 2 ranks (1 thread each) and the
same scenarios in this process, then compares: after 8 fp32 steps the largest weight
difference must be <= 1e-5 of the largest weight (token and sequence aggregation, two
mini-batches per step, uneven shares and micro-batch counts, loss-masked members, LoRA,
SFT), metrics equal within float summation order, and a distributed checkpoint resumed
at the other world size (2 -> 1 and 1 -> 2) within the same bound.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.batch import micro_batches
from trainer.data_parallel import rank_micro_batches, rank_of_items, shares
from trainer.step import SftSequence

from .data_parallel_runs import SAVE_AFTER, SCENARIOS, STEPS, backend_for, run_scenario, train

Runs = tuple[Path, dict[str, Any], dict[str, Any]]
BOUND = 1e-5  # of the largest weight, after 8 fp32 steps (the bound)
DEADLINE_S = 600


def seq(tokens: int) -> SftSequence:
    return SftSequence(token_ids=[1] * tokens, loss_mask=[0] + [1] * (tokens - 1))  # type: ignore[arg-type]


def test_shares_are_contiguous_token_balanced_and_a_function_of_the_batch() -> None:
    assert rank_of_items([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert rank_of_items([30, 5, 5, 5, 5], 2) == [0, 1, 1, 1, 1]  # the long one is half the tokens
    assert rank_of_items([4, 4], 4) == [1, 3]  # fewer items than ranks: some ranks get none
    assert rank_of_items([7, 3, 9], 1) == [0, 0, 0]
    items = [seq(n) for n in (5, 9, 2, 7, 7, 3)]
    split = shares(items, 3)
    assert [s for share in split for s in share] == items  # in order, nothing lost or repeated
    assert all(sum(s.tokens for s in share) <= 16 for share in split)  # 33 tokens over 3


def test_every_rank_runs_as_many_micro_batches_and_world_1_is_the_plain_packing() -> None:
    items = [seq(n) for n in (12, 12, 12, 3)]  # rank 0: two micro-batches of 12, rank 1: 12+3 in one
    plans = [rank_micro_batches(items, rank, 2, max_tokens=24) for rank in range(2)]
    assert [len(p) for p in plans] == [1, 1]
    plans = [rank_micro_batches(items, rank, 2, max_tokens=20) for rank in range(2)]
    assert [[len(m) for m in p] for p in plans] == [[1, 1], [1, 1]]
    uneven = [seq(n) for n in (16, 2, 2, 2, 2, 2, 2, 2, 2)]
    plans = [rank_micro_batches(uneven, rank, 2, max_tokens=8) for rank in range(2)]
    assert len(plans[0]) == len(plans[1]) and [] in plans[0]  # rank 0 padded with an empty one
    assert rank_micro_batches(items, 0, 1, 20) == micro_batches(items, 20)
    assert rank_micro_batches([], 0, 2, 20) == []


def _torchrun(out: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "tests.trainer.data_parallel_runs",
        str(out),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE_S, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]


def _largest_gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    largest = max(float(t.abs().max()) for t in a.values())
    return max(float((a[name] - b[name]).abs().max()) for name in a) / largest


def _close(x: dict[str, float], y: dict[str, float]) -> bool:
    return all(x[k] == pytest.approx(y[k], rel=1e-4, abs=1e-6) for k in x)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """(world-2 output dir, world-1 results, world-2 results) of every scenario."""
    one, two = tmp_path_factory.mktemp("world1"), tmp_path_factory.mktemp("world2")
    single = {s.name: run_scenario(s, one) for s in SCENARIOS if s.name != "from_world1"}
    shutil.copytree(one / "resume.state", two / "world1.state")
    shutil.copyfile(one / "resume.rng", two / "world1.rng")
    _torchrun(two)
    double = {s.name: torch.load(two / f"{s.name}.pt", weights_only=False) for s in SCENARIOS}
    return two, single, double


@pytest.mark.parametrize("name", ["token_mean", "seq_mean", "lora", "sft"])
def test_two_ranks_take_the_update_of_one(runs: Runs, name: str) -> None:
    _, single, double = runs
    gap = _largest_gap(single[name]["weights"], double[name]["weights"])
    assert gap <= BOUND, f"{name}: largest weight difference {gap:.2e} of the largest weight"
    assert _largest_gap(single[name]["weights"], backend_for(SCENARIOS[0], None).hf_state_dict()) > 1e-3
    assert len(double[name]["metrics"]) == STEPS
    for one, two in zip(single[name]["metrics"], double[name]["metrics"], strict=True):
        assert one["tokens"] == two["tokens"] and one["trajectories"] == two["trajectories"]
        assert _close(one, two), (one, two)


def test_a_checkpoint_resumes_at_the_other_world_size(runs: Runs) -> None:
    two, single, double = runs
    straight = single["resume"]["weights"]  # world 1, 8 steps (saving after 4 changes nothing)
    assert _largest_gap(straight, double["from_world1"]["weights"]) <= BOUND  # 1 -> 2
    scenario = next(s for s in SCENARIOS if s.name == "resume")
    resumed = backend_for(scenario, None)  # 2 -> 1
    resumed.load_state(two / "resume.state", torch.load(two / "resume.rng", weights_only=False))
    train(resumed, scenario, range(SAVE_AFTER, STEPS))
    assert _largest_gap(straight, resumed.hf_state_dict()) <= BOUND
