"""The real RL step learns a small multi-turn tool-use task (GRPO advantages, real loss and AdamW).

The environment (the test's own): the prompt asks for a one-time code that only a tool
hands out. Turn 1: the policy calls the tool (token TOOL) or answers at once. A tool call
draws a fresh code and appends it as the observation; the policy answers in turn 2.
Reward 1 when the answer is the code the tool returned, else 0 (an answer before any
tool call cannot know the code). A random policy scores ~1/36; scoring above 0.6 takes
both calling the tool and copying its output.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import torch

from streams.groups import advantages
from streams.outcomes import Outcome
from streams.payloads import GroupFormed, TimeBreakdown, TrajectoryAssembled
from streams.settings import PolicySettings
from trainer.batch import TrainSample, samples_of
from trainer.model import ModelConfig, PolicyModel, build_model
from trainer.settings import TrainerSettings
from trainer.step import make_optimizer, rl_step

ASK, TOOL = 0, 1
CODES = range(2, 6)  # the vocabulary: ASK, TOOL and four codes
GROUPS_PER_STEP, GROUP_SIZE, MAX_STEPS, WINDOW, CONVERGED = 8, 8, 100, 5, 0.9
SETTINGS = TrainerSettings(lr=1e-2, micro_batch_tokens=256)
CONFIG = ModelConfig(
    vocab_size=6,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=64,
    max_position=8,
)


@dataclass(frozen=True)
class Episode:
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    reward: float


def sample_next(
    model: PolicyModel, rows: list[list[int]], generator: torch.Generator
) -> list[tuple[int, float]]:
    """One token per row (rows of equal length) at temperature 1, with its logprob."""
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor(rows))[:, -1].float(), dim=-1)
    tokens = torch.multinomial(logprobs.exp(), 1, generator=generator)[:, 0]
    return [(int(t), float(logprobs[i, t])) for i, t in enumerate(tokens)]


def play(model: PolicyModel, episodes: int, generator: torch.Generator) -> list[Episode]:
    """`episodes` episodes: turn 1 for all at once, the tool, then turn 2 for those that called it."""
    first = sample_next(model, [[ASK]] * episodes, generator)
    done: dict[int, Episode] = {}
    called = [i for i, (token, _) in enumerate(first) if token == TOOL]
    for i, (token, logprob) in enumerate(first):
        if token != TOOL:
            done[i] = Episode([ASK, token], [0, 1], [0.0, logprob], 0.0)
    codes = torch.randint(CODES.start, CODES.stop, (len(called),), generator=generator).tolist()
    rows = [[ASK, TOOL, code] for code in codes]
    answers = sample_next(model, rows, generator) if rows else []
    for i, row, (answer, logprob) in zip(called, rows, answers, strict=True):
        logprobs = [0.0, first[i][1], 0.0, logprob]
        done[i] = Episode([*row, answer], [0, 1, 0, 1], logprobs, float(answer == row[-1]))
    return [done[i] for i in range(episodes)]


def assembled(episode: Episode) -> TrajectoryAssembled:
    generated = sum(episode.loss_mask)
    return TrajectoryAssembled(
        attempt=0,
        outcome=Outcome.RESOLVED if episode.reward else Outcome.UNRESOLVED,
        reward=episode.reward,
        token_ids=episode.token_ids,
        loss_mask=episode.loss_mask,
        rollout_logprobs=episode.logprobs,
        token_versions=[-1 if m == 0 else 0 for m in episode.loss_mask],
        prompt_tokens=1,
        turns=generated,
        generated_tokens=generated,
        context_tokens=len(episode.token_ids),
        times=TimeBreakdown(),
        policy={},
    )


def kept_samples(group_index: int, episodes: list[Episode], policy: PolicySettings) -> list[TrainSample]:
    """The group as the stream worker would form it: zero-variance groups dropped."""
    rewards = [e.reward for e in episodes]
    if len(set(rewards)) == 1:
        return []
    members = [f"g{group_index}-a{i}" for i in range(len(episodes))]
    group = GroupFormed(members=members, rewards=rewards, advantages=advantages(rewards, policy), policy={})
    return samples_of(group, dict(zip(members, map(assembled, episodes), strict=True)), f"g{group_index}")


def window_means(rewards: list[float]) -> list[float]:
    return [sum(rewards[i - WINDOW : i]) / WINDOW for i in range(WINDOW, len(rewards) + 1)]


def train(seed: int) -> list[float]:
    """Mean reward of each step's episodes (played before that step's update), until the last
    WINDOW steps average above CONVERGED or MAX_STEPS have run."""
    generator = torch.Generator().manual_seed(seed)
    model = build_model(CONFIG, seed=seed)
    optimizer = make_optimizer(model, SETTINGS, SETTINGS.lr)
    policy, rewards = PolicySettings(), []
    for step in range(MAX_STEPS):
        episodes = play(model, GROUPS_PER_STEP * GROUP_SIZE, generator)
        rewards.append(sum(e.reward for e in episodes) / len(episodes))
        samples: list[TrainSample] = []
        for g in range(GROUPS_PER_STEP):
            group = episodes[g * GROUP_SIZE : (g + 1) * GROUP_SIZE]
            samples += kept_samples(step * GROUPS_PER_STEP + g, group, policy)
        if samples:  # every group zero-variance: nothing to learn from this step
            rl_step(model, optimizer, samples, SETTINGS, torch.device("cpu"))
        if len(rewards) >= WINDOW and window_means(rewards)[-1] > CONVERGED:
            break
    return rewards


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mean_reward_rises_through_the_real_rl_step(seed: int) -> None:
    started, cpu_started = time.perf_counter(), time.process_time()
    rewards = train(seed)
    means = window_means(rewards)
    first_above = next((i + WINDOW for i, m in enumerate(means) if m > 0.6), None)
    print(
        f"seed {seed}: first step {rewards[0]:.3f}, last {WINDOW} steps {means[-1]:.3f}, "
        f"{len(rewards)} steps (window above 0.6 after {first_above}), "
        f"{time.perf_counter() - started:.1f}s wall, {time.process_time() - cpu_started:.1f}s CPU"
    )
    assert rewards[0] < 0.2  # the untrained policy rarely calls the tool and copies its code
    assert means[-1] > 0.6
