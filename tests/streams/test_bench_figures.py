"""bench.figures.percentile: the one percentile rule of bench/ (nearest rank), the same rule the
tail share in streams.tail uses for "after 90% had finished"."""

from __future__ import annotations

import random

import pytest

from bench.figures import percentile
from streams.tail import tail_share


def test_percentile_is_the_nearest_rank_and_always_a_measured_value() -> None:
    values = [float(v) for v in range(10, 0, -1)]  # 10 .. 1, unsorted on purpose
    assert [percentile(values, q) for q in (0.0, 0.1, 0.5, 0.55, 0.9, 0.91, 0.99, 1.0)] == [
        1.0,
        1.0,
        5.0,
        6.0,
        9.0,
        10.0,
        10.0,
        10.0,
    ]
    rng = random.Random(7)
    sample = [rng.lognormvariate(0.6, 0.4) for _ in range(333)]
    for q in (0.5, 0.9, 0.99):
        value = percentile(sample, q)
        assert value in sample
        at_or_below = sum(v <= value for v in sample)
        assert at_or_below >= q * len(sample) > at_or_below - 1  # the smallest such value


def test_percentile_matches_the_tail_share_rule() -> None:
    rng = random.Random(3)
    for n in (1, 7, 10, 31, 200):
        spans = [(0.0, rng.uniform(1, 100)) for _ in range(n)]
        ends = [end for _, end in spans]
        last = max(ends)
        assert tail_share(spans) == pytest.approx((last - percentile(ends, 0.9)) / last)


@pytest.mark.parametrize(
    ("values", "q", "says"), [([1.0], 99, "outside"), ([1.0], -0.1, "outside"), ([], 0.5, "no values")]
)
def test_bad_input_is_refused_with_what_to_do(values: list[float], q: float, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        percentile(values, q)
