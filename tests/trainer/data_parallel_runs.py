"""Training runs of `TorchBackend` for the data-parallel tests: the same batches at any world size.

`python -m torch.distributed.run --nproc-per-node 2 -m tests.trainer.data_parallel_runs OUT` runs
every `SCENARIOS` entry on 2 FSDP2 ranks and writes, from rank 0, `OUT/<name>.pt` with the
final HF weights and every step's metrics; the tests run the same scenarios in one process
(`run_scenario` without a world) and compare. Scenario `resume` also saves its state after
`SAVE_AFTER` steps (`OUT/resume.state`, continued at world 1 by the test) and `from_world1`
resumes from a world-1 state the test wrote before (`OUT/world1.state`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from streams.packed import pack, unpack
from trainer.backends import TorchBackend
from trainer.batch import TrainSample
from trainer.distributed import World, close_world, init_world
from trainer.model import ModelConfig, build_model
from trainer.settings import LoraSettings, TrainerSettings
from trainer.step import SftSequence

CONFIG = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position=64,
)
STEPS = 8
SAVE_AFTER = 4
# DP_RUNS_DEVICE=cuda: the same runs on GPUs (NCCL), as scripts/gpu_smoke.sh does.
BASE = TrainerSettings(
    lr=3e-3,
    torch_threads=1,
    micro_batch_tokens=40,
    dist_timeout_s=60.0,
    device=os.environ.get("DP_RUNS_DEVICE", "cpu"),
)


@dataclass(frozen=True)
class Scenario:
    name: str
    settings: TrainerSettings
    sft: bool = False


SCENARIOS = (
    Scenario("token_mean", BASE.model_copy(update={"updates_per_step": 2})),
    Scenario("seq_mean", BASE.model_copy(update={"loss_aggregation": "seq_mean_token_mean"})),
    Scenario("lora", BASE.model_copy(update={"lora": LoraSettings(rank=4, alpha=8.0)})),
    Scenario("sft", BASE, sft=True),
    Scenario("resume", BASE),
    Scenario("from_world1", BASE),
)


def sample(rng: random.Random, index: int) -> TrainSample:
    """A trajectory of 4..14 tokens: a prompt, then generated tokens (some masked as observations)."""
    length = rng.randint(4, 14)
    ids = [rng.randrange(CONFIG.vocab_size) for _ in range(length)]
    mask = [0, 0] + [1 if rng.random() < 0.8 else 0 for _ in range(length - 2)]
    logprobs = [-rng.uniform(0.5, 4.0) if m else 0.0 for m in mask]
    return TrainSample(
        group_id=f"g{index // 4}",
        trajectory_id=f"t{index}",
        token_ids=unpack(pack(ids, "i"), "i"),
        loss_mask=unpack(pack(mask, "b"), "b"),
        rollout_logprobs=unpack(pack(logprobs, "d"), "d"),
        token_versions=unpack(pack([0 if m else -1 for m in mask], "i"), "i"),
        advantage=rng.uniform(-1.5, 1.5),
        reward=float(rng.random() < 0.5),
        loss_masked=index % 11 == 5,  # an overlong member now and then: no loss
    )


@functools.cache
def batches(steps: int = STEPS) -> list[list[TrainSample]]:
    """Every step's batch: 5..9 samples of uneven lengths (shares and micro-batch counts differ)."""
    rng = random.Random(7)
    out, index = [], 0
    for _ in range(steps):
        size = rng.randint(5, 9)
        out.append([sample(rng, index + i) for i in range(size)])
        index += size
    return out


def backend_for(scenario: Scenario, world: World | None) -> TorchBackend:
    return TorchBackend(build_model(CONFIG, seed=3), scenario.settings, lr=scenario.settings.lr, world=world)


def train(backend: TorchBackend, scenario: Scenario, steps: range) -> list[dict[str, float]]:
    metrics = []
    for batch in (batches()[step] for step in steps):
        if scenario.sft:
            result = backend.sft_step([SftSequence(s.token_ids, s.loss_mask) for s in batch])
        else:
            result = backend.rl_step(batch)
        metrics.append({k: v for k, v in dataclasses.asdict(result).items() if not k.endswith("_s")})
    return metrics


def run_scenario(scenario: Scenario, out: Path, world: World | None = None) -> dict[str, Any]:
    """The scenario's run (module docstring); returns {"weights", "metrics"} (weights on rank 0)."""
    backend = backend_for(scenario, world)
    first = 0
    if scenario.name == "from_world1":
        backend.load_state(out / "world1.state", torch.load(out / "world1.rng", weights_only=False))
        first = SAVE_AFTER
    metrics = train(backend, scenario, range(first, SAVE_AFTER))
    if scenario.name == "resume":
        rng = backend.save_state(out / "resume.state")
        if world is None or world.leader:
            torch.save(rng, out / "resume.rng")
    metrics += train(backend, scenario, range(max(first, SAVE_AFTER), STEPS))
    return {"weights": backend.hf_state_dict(), "metrics": metrics}


def main(out: Path) -> None:
    world = init_world(BASE)
    try:
        for scenario in SCENARIOS:
            result = run_scenario(scenario, out, world)
            if world.leader:
                torch.save(result, out / f"{scenario.name}.pt")
    finally:
        close_world(world)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
