"""The GRPO loss against numbers worked out by hand: surrogate, clips, TIS, KL, aggregation, metrics."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.loss import (
    Denominators,
    Ratio,
    aggregate,
    clip_counts,
    effective_sample_size,
    mismatch_metrics,
    next_token_entropy,
    next_token_logprobs,
    per_token_loss,
    policy_loss,
    truncated_importance_weights,
)
from trainer.settings import TrainerSettings

SETTINGS = TrainerSettings()  # clip_low 0.2, clip_high 0.28, tis_cap 2.0, no KL
ONE = torch.ones(1, 1)


def one_token(ratio: float, advantage: float, tis: float = 1.0, settings: TrainerSettings = SETTINGS):
    """(loss, d loss / d logp) of a single loss token with this ratio, advantage and TIS weight."""
    logp_old = torch.tensor([[math.log(0.5)]])
    logp = (logp_old + math.log(ratio)).requires_grad_()
    logp_rollout = logp_old - math.log(tis)
    loss = per_token_loss(
        Ratio.of(logp, logp_old, ONE), logp_old, logp_rollout, torch.tensor([advantage]), ONE, settings
    )
    loss.sum().backward()
    assert logp.grad is not None
    return float(loss.detach()), float(logp.grad)


def test_next_token_logprobs_score_the_token_after_each_position() -> None:
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(4.0), 0.0], [5.0, 5.0]]])
    tokens = torch.tensor([[0, 1, 0]])
    # position 0 → token 1: p = 3/4; position 1 → token 0: p = 4/5; the last position predicts nothing
    expected = torch.tensor([[math.log(3 / 4), math.log(4 / 5)]])
    torch.testing.assert_close(next_token_logprobs(logits, tokens), expected)
    uniform = torch.zeros(1, 3, 4)
    torch.testing.assert_close(next_token_entropy(uniform), torch.full((1, 2), math.log(4.0)))


def test_surrogate_and_tis_weight_by_hand() -> None:
    # r = 1.1 (inside both clips), A = 1, w = exp(log 0.5 - log 0.4) = 1.25: loss = -1.25 * 1.1
    loss, grad = one_token(1.1, 1.0, tis=1.25)
    assert loss == pytest.approx(-1.375, rel=1e-6)
    assert grad == pytest.approx(-1.375, rel=1e-6)  # d(-w r A)/d logp = -w r A
    loss, grad = one_token(0.9, -2.0, tis=0.5)  # A < 0: loss = -0.5 * 0.9 * -2 = 0.9
    assert loss == pytest.approx(0.9, rel=1e-6)
    assert grad == pytest.approx(0.9, rel=1e-6)


@pytest.mark.parametrize(
    ("ratio", "advantage", "clipped"),
    [
        (1.28 - 1e-3, 1.0, False),  # just inside 1 + clip_high
        (1.28 + 1e-3, 1.0, True),  # just outside: the clipped term is smaller, no gradient
        (0.8 + 1e-3, -1.0, False),  # just inside 1 - clip_low
        (0.8 - 1e-3, -1.0, True),
        (0.5, 1.0, False),  # A > 0 below the low clip: min keeps r·A, still pushes up
        (2.0, -1.0, False),  # A < 0 above the high clip: min keeps r·A, still pushes down
    ],
)
def test_each_clip_acts_exactly_at_its_threshold(ratio: float, advantage: float, clipped: bool) -> None:
    loss, grad = one_token(ratio, advantage)
    if clipped:
        bound = 1.28 if advantage > 0 else 0.8
        assert loss == pytest.approx(-bound * advantage, rel=1e-6)
        assert grad == 0.0
    else:
        assert loss == pytest.approx(-ratio * advantage, rel=1e-6)
        assert grad == pytest.approx(-ratio * advantage, rel=1e-6)
    logp_old = torch.tensor([[math.log(0.5)]])
    ratios = Ratio.of(logp_old + math.log(ratio), logp_old, ONE)
    low, high = clip_counts(ratios, torch.tensor([advantage]), ONE, SETTINGS)
    assert (low, high) == ((int(clipped), 0) if advantage < 0 else (0, int(clipped)))


def test_tis_weight_is_capped_at_exactly_tis_cap() -> None:
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0]])
    rollout = -torch.tensor([[math.log(2.0) - 1e-4, math.log(2.0) + 1e-4, math.log(0.25), 5.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights = truncated_importance_weights(old, rollout, mask, cap=2.0)
    expected = torch.tensor([[math.exp(math.log(2.0) - 1e-4), 2.0, 0.25, 0.0]])
    torch.testing.assert_close(weights, expected)
    loss, _ = one_token(1.0, 1.0, tis=3.0)  # weight 3 capped at 2: loss = -2 · 1 · 1
    assert loss == pytest.approx(-2.0, rel=1e-6)


def test_kl_term_adds_k3_and_is_zero_at_the_behaviour_policy() -> None:
    with_kl = TrainerSettings(kl_coef=0.5)
    loss, _ = one_token(1.0, 0.0, settings=with_kl)
    assert loss == 0.0
    loss, _ = one_token(2.0, 0.0, settings=with_kl)  # k3 = 1/r + log r - 1 = 0.5 + log 2 - 1
    assert loss == pytest.approx(0.5 * (0.5 + math.log(2.0) - 1.0), rel=1e-6)


def test_both_aggregations_by_hand() -> None:
    token_loss = torch.tensor([[1.0, 2.0, 9.0], [4.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    denominators = Denominators.of([mask])
    assert denominators == Denominators(tokens=3, sequences=2)
    assert float(aggregate(token_loss, mask, "token_mean", denominators)) == pytest.approx(7 / 3)
    seq_mean = float(aggregate(token_loss, mask, "seq_mean_token_mean", denominators))
    assert seq_mean == pytest.approx((1.5 + 4.0) / 2)
    with pytest.raises(ValueError, match="token_mean or seq_mean_token_mean"):
        aggregate(token_loss, mask, "sum", denominators)


def random_batch(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    batch, length, vocab = 4, 7, 11
    token_ids = torch.randint(0, vocab, (batch, length), generator=generator)
    mask = torch.zeros(batch, length - 1)
    mask[0, 2:5] = 1
    mask[1, 1:6] = 1
    mask[2, 3] = 1  # row 3 has no loss tokens at all
    return {
        "logits": torch.randn(batch, length, vocab, generator=generator),
        "token_ids": token_ids,
        "logp_old": -torch.rand(batch, length - 1, generator=generator) * 3,
        "logp_rollout": -torch.rand(batch, length - 1, generator=generator) * 3,
        "advantages": torch.tensor([1.0, -0.5, 2.0, 1.5]),
        "mask": mask,
    }


def loss_and_grad(batch: dict[str, torch.Tensor], rows: list[slice], settings: TrainerSettings):
    logits = batch["logits"].clone().requires_grad_()
    denominators = Denominators.of([batch["mask"]])
    total = torch.zeros(())
    for part in rows:
        loss, _ = policy_loss(
            logits[part],
            batch["token_ids"][part],
            batch["logp_old"][part],
            batch["logp_rollout"][part],
            batch["advantages"][part],
            batch["mask"][part],
            settings,
            denominators,
        )
        loss.backward()
        total = total + loss.detach()
    assert logits.grad is not None
    return total, logits.grad


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_micro_batched_accumulation_equals_the_full_batch(aggregation: str) -> None:
    settings = TrainerSettings(loss_aggregation=aggregation, kl_coef=0.1)
    batch = random_batch(0)
    full_loss, full_grad = loss_and_grad(batch, [slice(0, 4)], settings)
    micro_loss, micro_grad = loss_and_grad(batch, [slice(0, 1), slice(1, 3), slice(3, 4)], settings)
    torch.testing.assert_close(micro_loss, full_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(micro_grad, full_grad, rtol=1e-6, atol=1e-8)
    assert float(full_grad.abs().sum()) > 0


def test_gradients_are_zero_for_prompt_and_observation_positions() -> None:
    batch = random_batch(1)
    batch["logp_old"] = next_token_logprobs(batch["logits"], batch["token_ids"])  # r = 1: nothing clipped
    _, grad = loss_and_grad(batch, [slice(0, 4)], TrainerSettings())
    # logits at t predict token t+1: their gradient is nonzero exactly where mask[t] is 1
    per_position = grad[:, :-1].abs().sum(-1)
    assert torch.equal(per_position > 0, batch["mask"] > 0)
    assert float(grad[:, -1].abs().sum()) == 0.0  # the last position predicts no target
    assert float(grad[3].abs().sum()) == 0.0


def test_effective_sample_size_and_mismatch_by_hand() -> None:
    assert effective_sample_size(torch.log(torch.tensor([1.0, 3.0]))) == pytest.approx(16 / 20)
    assert effective_sample_size(torch.full((5,), -700.0)) == pytest.approx(1.0)  # stable far from 0
    old = [torch.tensor([-1.0, -2.0, -9.0]), torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-4.0])]
    rollout = [
        torch.tensor([-1.0, -2.0 - math.log(3.0), 0.0]),
        torch.tensor([-1.0, -1.5, -0.5]),
        torch.tensor([0.0]),
    ]
    masks = [torch.tensor([1.0, 1.0, 0.0]), torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0.0])]
    metrics = mismatch_metrics(old, rollout, masks)
    # token log-ratios on loss tokens: 0, log 3 | 0, 0.5, -0.5 (the third sequence has none)
    assert metrics.mean_logprob_diff == pytest.approx((math.log(3.0) + 1.0) / 5)
    weights = torch.tensor([1.0, 3.0, 1.0, math.exp(0.5), math.exp(-0.5)])
    assert metrics.ess == pytest.approx(float(weights.sum() ** 2 / (5 * (weights**2).sum())))
    # sequence weights: exp(log 3) = 3 and exp(0) = 1
    assert metrics.ess_seq == pytest.approx(16 / 20)
