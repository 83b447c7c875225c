"""Samples from groups, micro-batches, and the torch RL / SFT steps on the real policy model."""

from __future__ import annotations

import copy
from array import array

import pytest
import torch
import torch.nn.functional as F

from streams.outcomes import Outcome
from streams.payloads import GroupFormed, TimeBreakdown, TrajectoryAssembled
from trainer.batch import GroupMismatchError, MissingTrajectoryError, TrainSample, micro_batches, samples_of
from trainer.model import KVCache, ModelConfig, PolicyModel, build_model
from trainer.settings import TrainerSettings
from trainer.step import SftSequence, make_optimizer, rl_step, sequence_logprobs, sft_step

CPU = torch.device("cpu")
CONFIG = ModelConfig(
    vocab_size=64,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=64,
    max_position=64,
)
SETTINGS = TrainerSettings(lr=1e-3)


def trajectory(tokens: list[int], mask: list[int], reward: float = 1.0) -> TrajectoryAssembled:
    logprobs = [-1.0 - 0.1 * i if m else 0.0 for i, m in enumerate(mask)]
    return TrajectoryAssembled(
        attempt=0,
        outcome=Outcome.RESOLVED,
        reward=reward,
        token_ids=tokens,
        loss_mask=mask,
        rollout_logprobs=logprobs,
        token_versions=[0 if m else -1 for m in mask],
        prompt_tokens=2,
        turns=1,
        generated_tokens=sum(mask),
        context_tokens=len(tokens),
        times=TimeBreakdown(),
        policy={},
    )


def group(members: list[str], **overrides: object) -> GroupFormed:
    fields: dict[str, object] = {
        "members": members,
        "rewards": [1.0, 0.0, 0.0][: len(members)],
        "advantages": [1.4, -0.7, -0.7][: len(members)],
        "policy": {},
    }
    return GroupFormed(**{**fields, **overrides})


def sample(tokens: list[int], mask: list[int], advantage: float, **overrides: object) -> TrainSample:
    t = trajectory(tokens, mask)
    fields: dict[str, object] = {
        "group_id": "g",
        "trajectory_id": f"t{tokens[0]}",
        "token_ids": t.token_ids,
        "loss_mask": t.loss_mask,
        "rollout_logprobs": t.rollout_logprobs,
        "token_versions": t.token_versions,
        "advantage": advantage,
        "reward": 1.0 if advantage > 0 else 0.0,
    }
    return TrainSample(**{**fields, **overrides})  # type: ignore[arg-type]


def test_samples_of_a_kept_group_in_member_order() -> None:
    trajectories = {"a": trajectory([1, 2, 3, 4], [0, 0, 1, 1]), "b": trajectory([1, 2, 5], [0, 0, 1])}
    samples = samples_of(group(["b", "a"], loss_masked=[False, True]), trajectories, "g1")
    assert [(s.trajectory_id, s.advantage, s.reward, s.loss_masked) for s in samples] == [
        ("b", 1.4, 1.0, False),
        ("a", -0.7, 0.0, True),
    ]
    assert list(samples[1].token_ids) == [1, 2, 3, 4] and samples[1].group_id == "g1"


def test_samples_of_says_what_does_not_fit() -> None:
    good = {"a": trajectory([1, 2, 3], [0, 0, 1]), "b": trajectory([1, 2, 4], [0, 0, 1])}
    with pytest.raises(MissingTrajectoryError, match="not yet consumed: c"):
        samples_of(group(["a", "c"]), good)
    with pytest.raises(GroupMismatchError, match="was dropped \\(zero_variance\\)"):
        samples_of(group(["a", "b"], dropped="zero_variance"), good)
    with pytest.raises(GroupMismatchError, match="2 members but 3 advantages"):
        samples_of(group(["a", "b"], advantages=[1.0, -1.0, 0.0]), good)
    broken = trajectory([1, 2, 3], [0, 0, 1]).model_copy(update={"loss_mask": array("b", [0, 1])})
    with pytest.raises(GroupMismatchError, match="arrays of different lengths"):
        samples_of(group(["a", "b"]), {**good, "b": broken})


def test_micro_batches_keep_order_and_bound_padded_tokens() -> None:
    lengths = [3, 3, 5, 12, 2, 2, 2]
    samples = [sample(list(range(1, n + 1)), [0] + [1] * (n - 1), 1.0) for n in lengths]
    batches = micro_batches(samples, 10)
    assert [[s.tokens for s in b] for b in batches] == [[3, 3], [5], [12], [2, 2, 2]]
    assert [s for b in batches for s in b] == samples
    assert micro_batches(samples, 10) == batches
    with pytest.raises(ValueError, match="micro_batch_tokens"):
        micro_batches(samples, 0)


def batch_of_samples() -> list[TrainSample]:
    return [
        sample([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 1, 0, 0, 1], 1.5),  # turn, observation, turn
        sample([8, 9, 10, 11], [0, 0, 1, 1], -0.5),
        sample([12, 13, 14, 15, 16], [0, 1, 1, 1, 1], -1.0),
        sample([17, 18, 19], [0, 0, 1], 0.25),
    ]


def trained(model: PolicyModel, samples: list[TrainSample], settings: TrainerSettings, steps: int = 2):
    optimizer = make_optimizer(model, settings, settings.lr)
    metrics = [rl_step(model, optimizer, samples, settings, CPU) for _ in range(steps)]
    return optimizer, metrics


def test_rl_step_is_bit_exact_on_resume() -> None:
    samples = batch_of_samples()
    model = build_model(CONFIG, seed=3)
    optimizer, _ = trained(model, samples, SETTINGS, steps=1)
    saved_model, saved_optimizer = copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())
    rl_step(model, optimizer, samples, SETTINGS, CPU)
    resumed = build_model(CONFIG, seed=99)
    resumed.load_state_dict(saved_model)
    resumed_optimizer = make_optimizer(resumed, SETTINGS, SETTINGS.lr)
    resumed_optimizer.load_state_dict(saved_optimizer)
    rl_step(resumed, resumed_optimizer, samples, SETTINGS, CPU)
    for (name, a), (_, b) in zip(model.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert not torch.equal(model.state_dict()["lm_head.weight"], build_model(CONFIG, 3).lm_head.weight)


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_size_does_not_change_the_step(aggregation: str) -> None:
    samples = batch_of_samples()
    results = []
    for tokens in (7, 10_000):  # one sample per micro-batch, or all in one
        settings = TrainerSettings(lr=1e-3, micro_batch_tokens=tokens, loss_aggregation=aggregation)
        model = build_model(CONFIG, seed=1)
        _, metrics = trained(model, samples, settings, steps=1)
        results.append((metrics[0], model.lm_head.weight.detach().clone()))
    (small, small_weights), (large, large_weights) = results
    assert small.loss == pytest.approx(large.loss, rel=1e-5, abs=1e-7)
    assert small.grad_norm == pytest.approx(large.grad_norm, rel=1e-5)
    torch.testing.assert_close(small_weights, large_weights, rtol=1e-5, atol=1e-7)


def test_no_gradient_through_observations_or_loss_masked_members() -> None:
    samples = [
        sample([1, 2, 3, 4, 40, 41], [0, 0, 1, 1, 0, 0], 1.0),  # trailing observation 40, 41
        sample([5, 6, 7, 8], [0, 0, 1, 1], -1.0),
        sample([50, 51, 52, 53], [0, 0, 1, 1], 2.0, loss_masked=True, reward=1.0),
    ]
    model = build_model(CONFIG, seed=0)
    _, (metrics,) = trained(model, samples, SETTINGS, steps=1)
    grad = model.model.embed_tokens.weight.grad
    assert grad is not None
    unused = [40, 41, 50, 51, 52, 53]  # after the last loss token, or only in the masked member
    assert float(grad[unused].abs().sum()) == 0.0
    assert float(grad[[1, 2, 3, 5, 6, 7]].abs().sum(-1).min()) > 0
    assert metrics.tokens == 10 and metrics.trajectories == 3
    assert metrics.reward_mean == pytest.approx(2 / 3)  # the masked member still counts here


def test_rl_step_metrics_when_engine_and_trainer_agree() -> None:
    model = build_model(CONFIG, seed=2)
    base = batch_of_samples()
    scored = sequence_logprobs(model, base, SETTINGS, CPU)
    samples = [
        sample(
            list(s.token_ids),
            list(s.loss_mask),
            s.advantage,
            rollout_logprobs=array("d", [0.0, *logprobs.tolist()]),
        )
        for s, logprobs in zip(base, scored, strict=True)
    ]
    _, (metrics,) = trained(model, samples, SETTINGS, steps=1)
    assert metrics.mean_logprob_diff < 1e-6
    assert metrics.ess == pytest.approx(1.0) and metrics.ess_seq == pytest.approx(1.0)
    assert metrics.clip_frac_low == metrics.clip_frac_high == 0.0  # one update: r = 1
    assert 0 < metrics.entropy <= torch.log(torch.tensor(64.0)).item() + 1e-5
    assert metrics.grad_norm > 0 and metrics.logprob_s > 0 and metrics.update_s > 0
    # with several updates a large learning rate moves the ratio past a clip in the later ones
    settings = TrainerSettings(lr=0.05, updates_per_step=2, grad_clip=100.0)
    _, (moved,) = trained(build_model(CONFIG, seed=2), samples + samples, settings, steps=1)
    assert moved.clip_frac_low + moved.clip_frac_high > 0


def test_sft_step_is_cross_entropy_on_loss_tokens() -> None:
    model = build_model(CONFIG, seed=4)
    sequences = [
        SftSequence(array("i", [1, 2, 3, 4, 5]), array("b", [0, 0, 1, 1, 1])),
        SftSequence(array("i", [6, 7, 8]), array("b", [0, 1, 1])),
    ]
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4, 5]]))[0]
        first = F.cross_entropy(logits[1:4], torch.tensor([3, 4, 5]), reduction="sum")
        logits = model(torch.tensor([[6, 7, 8]]))[0]
        second = F.cross_entropy(logits[0:2], torch.tensor([7, 8]), reduction="sum")
    optimizer = make_optimizer(model, SETTINGS, lr=1e-2)
    metrics = [sft_step(model, optimizer, sequences, SETTINGS, CPU) for _ in range(20)]
    assert metrics[0].loss == pytest.approx(float(first + second) / 5, rel=1e-5)
    assert metrics[-1].loss < 0.5 * metrics[0].loss
    assert metrics[0].tokens == 8 and metrics[0].trajectories == 2


def test_model_and_step_tensors_stay_on_the_model_device() -> None:
    # On the meta device any tensor created on CPU and mixed in raises, so this checks on a
    # CPU-only machine what CUDA/ROCm training needs: no tensor without `device=`.
    meta = torch.device("meta")
    model = build_model(CONFIG, seed=0).to(meta)
    (scored, *_) = sequence_logprobs(model, batch_of_samples(), SETTINGS, meta)
    assert scored.device == meta and scored.shape == (6,)
    cache = KVCache.empty(CONFIG, 2, 16, torch.float32, device=meta)
    assert all(k.device == meta for k in cache.keys + cache.values)
