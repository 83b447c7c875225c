"""`rollstream bench trainer --ranks N`: the trainer on N data-parallel ranks against one rank, same batches.

Both paths are `rollstream train` processes, each over its own copy of one recorded log
(synthetic groups, every one kept, in the order the trainer takes them): world 1 with
`trainer.torch_threads` = N (the machine's threads in one process) and world N under
torchrun with 1 thread per rank (`--ranks N`, FSDP2). Each trains `steps` steps; the first
is a warm-up and not timed; tokens/s is the tokens of the timed steps over the wall time
between the first and the last step's `trainer.steps` events, as `bench trainer` measures.

- `comm_share`: world N's Σ `comm_s` over Σ (`logprob_s` + `update_s`) of its timed steps:
  wall time inside FSDP2's all-gathers and reduce-scatters (timed around each call; on CPU
  they run synchronously) and the step's metric collectives, over the steps' compute time.
- `resume_bit_exact`: a third run, world N with `trainer.checkpoint_every` 1, whose rank 1 is
  SIGKILLed inside step `kill_step` (after it took the batch; rank 0 waits for it in the
  step's first all-gather); torchrun restarts the group, which resumes from the checkpoint of
  the step before; true when every version it publishes is byte-identical to world N's
  uninterrupted run's.
- `max_weight_gap`: world N's last version against world 1's, the largest |difference| over
  the largest |weight| (float summation order; the tests bound it at 1e-5 in fp32).
- `peak_rss_mb` / `single_peak_rss_mb`: the peak resident memory of each path's processes
  together (torchrun and its ranks), sampled every 50 ms.
Rounds alternate world N and world 1; medians are reported. Target: ratio >= 0.8.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from safetensors.torch import load_file

from bench.local_broker import fresh_topics
from rollstream.config import Config
from streams.bus import EventProducer, read_topic
from streams.eventgen.groups import GroupLogSpec, synthetic_groups
from streams.payloads import TrainerStep
from streams.settings import TopicSettings
from streams.topics import delete_topics
from trainer.versions import version_dir

RUN = "bench-trainer"
PROCESS_DEADLINE_S = 3600.0


@dataclass
class Output:
    """A process's output lines and when markers were seen (monotonic seconds)."""

    lines: list[str] = field(default_factory=list)
    marks: dict[str, float] = field(default_factory=dict)
    returncode: int = 0

    @property
    def text(self) -> str:
        return "".join(self.lines)


@dataclass(frozen=True)
class Signal:
    """Send `signal` to the rank whose `rank R of N: pid P` line names it, once `marker` shows."""

    marker: str
    rank: int
    signal: signal.Signals


def run_logged(
    command: list[str], signals: tuple[Signal, ...] = (), deadline_s: float = PROCESS_DEADLINE_S
) -> Output:
    """Run `command`, keep its output, send `signals` to its ranks as their markers show."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    output, pids = Output(), {}
    timer = threading.Timer(deadline_s, process.kill)
    timer.start()
    try:
        assert process.stdout is not None
        for line in process.stdout:
            output.lines.append(line)
            if found := re.search(r"rank (\d+) of \d+: pid (\d+)", line):
                pids[int(found.group(1))] = int(found.group(2))
            for wanted in signals:
                if wanted.marker in line and wanted.marker not in output.marks:
                    output.marks[wanted.marker] = time.monotonic()
                    os.kill(pids[wanted.rank], wanted.signal)
        output.returncode = process.wait()
    finally:
        timer.cancel()
    return output


class TreePeakRss:
    """Peak resident set size of this process's descendants together (the trainer processes it
    started: torchrun and its ranks), sampled in a thread."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s, self.peak_mb = every_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(self.every_s):
            total = 0
            for child in me.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    continue
            self.peak_mb = max(self.peak_mb, total / 2**20)

    def __enter__(self) -> TreePeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class Bench:
    """`settings`: the bench's own `--set`s (and `config`, its `--config`), passed on to every
    `rollstream train` it starts, so both paths train with the settings `cfg` was read with."""

    cfg: Config
    base: Path
    ranks: int
    steps: int
    kill_step: int
    spec: GroupLogSpec
    settings: tuple[str, ...] = ()
    config: Path | None = None


async def _log_on_fresh_topics(cfg: Config, spec: GroupLogSpec) -> TopicSettings:
    topics = await fresh_topics(cfg, "bench-ranks")
    async with EventProducer(cfg.kafka, topics) as producer:
        for topic, event in synthetic_groups(spec):
            await producer.send(topic, event)
    return topics


def _train(bench: Bench, topics: TopicSettings, state: Path, ranks: int, *extra: str) -> list[str]:
    threads = 1 if ranks > 1 else bench.ranks
    sets = [
        *bench.settings,
        f'kafka.bootstrap="{bench.cfg.kafka.bootstrap}"',
        f'topics.prefix="{topics.prefix}"',
        f'run.state_dir="{state}"',
        f'model.path="{bench.base}"',
        f"trainer.torch_threads={threads}",
        "policy.max_staleness=-1",
        *extra,
    ]
    command = [sys.executable, "-m", "rollstream", "train", "--run", RUN, "--steps", str(bench.steps)]
    command += ["--ranks", str(ranks), *(["--config", str(bench.config)] if bench.config else [])]
    return command + [arg for item in sets for arg in ("--set", item)]


def _figures(cfg: Config, topics: TopicSettings) -> dict[str, float]:
    records = asyncio.run(read_topic(cfg.kafka, topics, "trainer.steps"))
    done = sorted({r.event.id: r.event for r in records}.values(), key=lambda e: e.data.step)  # type: ignore[attr-defined]
    timed: list[TrainerStep] = [e.data for e in done[1:]]  # type: ignore[misc]
    wall = (done[-1].time_ns - done[0].time_ns) / 1e9
    compute = sum(s.times.logprob_s + s.times.update_s for s in timed)
    return {
        "tokens_per_s": sum(s.tokens for s in timed) / wall,
        "step_s": wall / len(timed),
        "comm_share": sum(s.times.comm_s for s in timed) / compute,
    }


def _one_path(
    bench: Bench, ranks: int, scratch: Path, *extra: str, signals: tuple[Signal, ...] = ()
) -> dict[str, Any]:
    """One `rollstream train` run on a fresh copy of the log: figures, peak memory, where it wrote."""
    topics = asyncio.run(_log_on_fresh_topics(bench.cfg, bench.spec))
    state = Path(tempfile.mkdtemp(prefix=f"world{ranks}-", dir=scratch))
    try:
        with TreePeakRss() as peak:
            command = _train(bench, topics, state, ranks, *extra)
            output = run_logged(command, signals)
        if output.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:8])} ... failed:\n{output.text[-4000:]}")
        figures = _figures(bench.cfg, topics)
    finally:
        asyncio.run(delete_topics(bench.cfg.kafka, topics))
    return {**figures, "peak_rss_mb": peak.peak_mb, "weights": state / "weights", "output": output}


def _versions(weights: Path, steps: int) -> list[bytes]:
    return [(version_dir(weights, RUN, v) / "model.safetensors").read_bytes() for v in range(1, steps + 1)]


def _gap(one: Path, other: Path, steps: int) -> float:
    a = load_file(str(version_dir(one, RUN, steps) / "model.safetensors"))
    b = load_file(str(version_dir(other, RUN, steps) / "model.safetensors"))
    largest = max(float(t.float().abs().max()) for t in a.values())
    return max(float((a[n].float() - b[n].float()).abs().max()) for n in a) / largest


def run(bench: Bench, rounds: int, say: Any) -> dict[str, Any]:
    """The figures of the module docstring, medians over `rounds` (the resume check runs once)."""
    many: list[dict[str, Any]] = []
    one: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-ranks-") as scratch:
        for number in range(1, rounds + 1):
            many.append(_one_path(bench, bench.ranks, Path(scratch)))
            one.append(_one_path(bench, 1, Path(scratch)))
            say(
                f"round {number}: {bench.ranks} ranks {many[-1]['tokens_per_s']:,.1f} tokens/s, "
                f"1 rank {one[-1]['tokens_per_s']:,.1f} tokens/s, comm share {many[-1]['comm_share']:.3f}"
            )
        exact = _resumes_bit_exact(bench, Path(scratch), many[0]["weights"])
        gap = _gap(one[0]["weights"], many[0]["weights"], bench.steps)
    return _summary(bench, many, one, exact, gap)


def _resumes_bit_exact(bench: Bench, scratch: Path, uninterrupted: Path) -> bool:
    marker = f"phase=follow.rl_step step={bench.kill_step} rank=1"
    sets = ("trainer.checkpoint_every=1", "trainer.max_restarts=1")
    killed = _one_path(bench, bench.ranks, scratch, *sets, signals=(Signal(marker, 1, signal.SIGKILL),))
    restarted = f"resumed run {RUN} at step {bench.kill_step - 1}" in killed["output"].text
    return restarted and _versions(killed["weights"], bench.steps) == _versions(uninterrupted, bench.steps)


def _summary(
    bench: Bench, many: list[dict[str, Any]], one: list[dict[str, Any]], exact: bool, gap: float
) -> dict[str, Any]:
    def median(runs: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    return {
        "ranks": bench.ranks,
        "tokens_per_s": round(median(many, "tokens_per_s"), 2),
        "single_tokens_per_s": round(median(one, "tokens_per_s"), 2),
        "ratio": round(median(many, "tokens_per_s") / median(one, "tokens_per_s"), 3),
        "comm_share": round(median(many, "comm_share"), 4),
        "resume_bit_exact": exact,
        "max_weight_gap": float(f"{gap:.3g}"),
        "step_s": round(median(many, "step_s"), 2),
        "single_step_s": round(median(one, "step_s"), 2),
        "peak_rss_mb": round(median(many, "peak_rss_mb"), 1),
        "single_peak_rss_mb": round(median(one, "peak_rss_mb"), 1),
        "torch_threads": {"per_rank": 1, "single": bench.ranks},
    }
