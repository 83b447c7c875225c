"""What the trainer waited for: the clock's split and CPU share, the sentence that names what binds,
and the rollouts in flight during the waits."""

from __future__ import annotations

import pytest

from trainer.waits import CpuSample, WaitClock, WaitSummary, mean_in_flight, summarise_waits, wait_reason


class Ticks:
    """A clock and a CPU counter the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy = 0.0
        self.total = 0.0

    def run(self, seconds: float, busy_share: float, cores: int = 2) -> None:
        self.now += seconds
        self.total += seconds * cores
        self.busy += seconds * cores * busy_share

    def cpu(self) -> CpuSample:
        return CpuSample(self.busy, self.total)


def test_the_clock_splits_the_wait_and_measures_the_cpu_meanwhile() -> None:
    ticks = Ticks()
    clock = WaitClock(clock=lambda: ticks.now, cpu=ticks.cpu)
    with clock.waiting_for("groups"):
        ticks.run(3.0, busy_share=1.0)
    ticks.run(0.5, busy_share=0.5)  # reading and judging records
    with clock.waiting_for("trajectories"):
        ticks.run(1.0, busy_share=0.0)
    with clock.waiting_for("groups"):
        ticks.run(0.5, busy_share=1.0)
    split = clock.finish()
    assert (split.wait_s, split.groups_s, split.trajectories_s) == (5.0, 3.5, 1.0)
    assert split.cpu_busy == pytest.approx((3.0 + 0.25 + 0.5) / 5.0)


def test_the_real_cpu_counter_moves() -> None:
    first = CpuSample.now()
    sum(i * i for i in range(200_000))
    second = CpuSample.now()
    busy, total = second.busy_s - first.busy_s, second.total_s - first.total_s
    assert total >= 0 and -1e-6 <= busy <= total + 1e-6  # counters in 10 ms ticks, summed as floats


def steps(
    wait: float, groups: float, trajectories: float, cpu: float | None, n: int = 4
) -> list[dict[str, float | None]]:
    times = {
        "wait_s": wait,
        "wait_groups_s": groups,
        "wait_trajectories_s": trajectories,
        "wait_cpu_busy": cpu,
    }
    return [{**times, "total_s": 10.0}] * n


@pytest.mark.parametrize(
    ("summary", "says"),
    [
        (summarise_waits(steps(1.0, 0.9, 0.0, 0.5)), "10% of its step time: its own work"),
        (summarise_waits([{"wait_s": 4.0, "total_s": 10.0}]), "written before the trainer recorded what for"),
        (summarise_waits(steps(5.0, 1.0, 3.5, 0.3)), "trajectories of formed groups not read yet"),
        (
            summarise_waits(steps(4.0, 3.8, 0.1, 0.97), 12.0, 32),
            "CPU 97% busy (12.0 rollouts in flight of 32",
        ),
        (summarise_waits(steps(4.0, 3.8, 0.1, 0.4), 31.5, 32), "every rollout slot busy"),
        (summarise_waits(steps(4.0, 3.8, 0.1, 0.4), 6.0, 32), "too few groups in flight"),
    ],
)
def test_the_sentence_names_what_binds(summary: WaitSummary, says: str) -> None:
    assert says in wait_reason(summary)
    assert summary.share == pytest.approx(summary.wait_s / summary.step_s)


def test_no_steps_no_verdict() -> None:
    assert wait_reason(summarise_waits([])) == "no trainer steps yet"


def test_cpu_is_weighted_by_each_steps_wait() -> None:
    times: list[dict[str, float | None]] = [
        {"wait_s": 3.0, "wait_groups_s": 3.0, "wait_cpu_busy": 1.0, "total_s": 4.0},
        {"wait_s": 1.0, "wait_groups_s": 1.0, "wait_cpu_busy": 0.0, "total_s": 2.0},
        {"wait_s": 9.0, "total_s": 10.0},  # an old record: no CPU figure, left out of the mean
    ]
    assert summarise_waits(times).cpu_busy == pytest.approx(0.75)


def test_rollouts_in_flight_are_a_time_weighted_mean_over_the_waits() -> None:
    spans: list[tuple[int, int | None]] = [(0, 10), (5, 15), (12, None)]  # the last still runs
    assert mean_in_flight(spans, [(0, 10)]) == pytest.approx(1.5)  # 1 for 5, then 2 for 5
    assert mean_in_flight(spans, [(0, 10), (20, 30)]) == pytest.approx((15 + 10) / 20)
    assert mean_in_flight(spans, [(3, 3)]) is None
