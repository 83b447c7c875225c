"""`rollstream bench trainer`: the trainer on Kafka vs a plain torch loop over the same batches.

Our path: `trainer.loop.RlTrainer` (the code of `rollstream train`) over a log that
already holds more groups than it consumes (groups arrive faster than it trains),
with its member trajectories on `trajectories`: ordering, joining, judging, the
step, writing and checksumming each version, and the events. Plain path: the
same model init, loss and optimizer (`trainer.step.rl_step`) over the same
batches, built in memory before timing. Both run their torch work on the one compute thread
(`trainer.compute_thread`), as `rollstream train` does. The first step of each path is a warm-up
and not timed; our time is wall time between the first and the last step's
`trainer.steps` events, the shares are the phases' sums over those steps. Rounds
alternate ours/plain; medians are reported. Last line: `{"tokens_per_s",
"plain_tokens_per_s", "ratio", "step_s", "wait_share", "logprob_share",
"update_share", "publish_share", "model", "dtype", "lora_rank", "peak_rss_mb",
"plain_peak_rss_mb"}`. Targets: ratio >= 0.9, wait share <= 0.05.

`--model DIR|NAME` trains that model (default: a small random one from [model]); `--dtype`
and `--lora-rank` set `trainer.dtype` and `trainer.lora.rank`. Peak memory is each path's
peak resident set size while it runs (sampled every 50 ms).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Annotated

import psutil
import torch
import typer

from bench import trainer_ranks
from bench.local_broker import ensure_local_broker, fresh_topics
from rollstream.command_line import ConfigPath, Overrides, console, fail, read_config, resolve_model_dir
from rollstream.config import Config
from streams.bus import EventProducer, read_topic
from streams.eventgen.groups import GroupLogSpec, synthetic_groups
from streams.events import Event
from streams.payloads import GroupFormed, TrainerStep, TrajectoryAssembled
from streams.topics import delete_topics
from trainer.backends import TorchBackend
from trainer.batch import TrainSample, samples_of
from trainer.checkpoint import init_model_dir, load_model
from trainer.checkpoint import read_config as read_model_config
from trainer.compute_thread import run_on_compute
from trainer.loop import RlTrainer, RunTarget, TrainerState
from trainer.lora import apply_lora
from trainer.step import make_optimizer, rl_step

RUN = "bench-trainer"
DTYPE_ALIASES = {"bf16": "bfloat16", "fp32": "float32"}


def _spec(vocab_size: int, groups: int, tokens: int, group_size: int) -> GroupLogSpec:
    return GroupLogSpec(
        run_id=RUN,
        groups=groups,
        group_size=group_size,
        prompt_tokens=tokens // 8,
        output_tokens=tokens - tokens // 8,
        vocab_size=vocab_size,
        versions_per_group=0.0,
    )


class PeakRss:
    """The process's peak resident set size while the block runs, sampled in a thread."""

    def __init__(self, every_s: float = 0.05) -> None:
        self.every_s = every_s
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        process = psutil.Process()
        while not self._stop.is_set():
            self.peak_mb = max(self.peak_mb, process.memory_info().rss / 2**20)
            self._stop.wait(self.every_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _batches(records: list[tuple[str, Event]], per_step: int) -> list[list[TrainSample]]:
    """The batches the trainer forms from this log (every group kept, in time order)."""
    by_id = {e.trajectory_id: e.data for t, e in records if isinstance(e.data, TrajectoryAssembled)}
    groups = [e for t, e in records if isinstance(e.data, GroupFormed)]
    samples = [samples_of(e.data, by_id, e.group_id or "") for e in groups]  # type: ignore[arg-type]
    return [[s for g in samples[i : i + per_step] for s in g] for i in range(0, len(samples), per_step)]


async def _ours(cfg: Config, base: Path, records: list[tuple[str, Event]], steps: int) -> dict[str, float]:
    topics = await fresh_topics(cfg, "bench")
    try:
        async with EventProducer(cfg.kafka, topics) as producer:
            for topic, event in records:
                await producer.send(topic, event)
        with tempfile.TemporaryDirectory(prefix="bench-trainer-") as scratch:
            model = run_on_compute(load_model, base)
            target = RunTarget(
                RUN,
                base,
                Path(scratch) / "weights",
                Path(scratch) / "checkpoint.pt",
                model.config,
                dataclasses.asdict(model.config),
            )
            trainer = RlTrainer(
                cfg.kafka,
                topics,
                cfg.trainer,
                max_staleness=-1,
                target=target,
                backend=run_on_compute(TorchBackend, model, cfg.trainer, lr=cfg.trainer.lr),
                state=TrainerState(0, 0),
                max_steps=steps,
            )
            await trainer.run(asyncio.Event())
        events = await read_topic(cfg.kafka, topics, "trainer.steps")
    finally:
        await delete_topics(cfg.kafka, topics)
    done = sorted((r.event for r in events), key=lambda e: e.data.step)  # type: ignore[attr-defined]
    timed: list[TrainerStep] = [e.data for e in done[1:]]  # type: ignore[misc]
    wall = (done[-1].time_ns - done[0].time_ns) / 1e9
    total = sum(s.times.total_s for s in timed)
    return {
        "tokens_per_s": sum(s.tokens for s in timed) / wall,
        "step_s": wall / len(timed),
        **{
            f"{phase}_share": sum(getattr(s.times, f"{phase}_s") for s in timed) / total
            for phase in ("wait", "logprob", "update", "publish")
        },
    }


def _plain(cfg: Config, base: Path, batches: list[list[TrainSample]], steps: int) -> float:
    model = load_model(base)
    if cfg.trainer.lora.rank:  # the same adapters as TorchBackend makes
        model = apply_lora(model, cfg.trainer.lora, cfg.trainer.seed)
    model = model.to(cfg.trainer.device).train()
    if cfg.trainer.torch_threads:
        torch.set_num_threads(cfg.trainer.torch_threads)
    optimizer = make_optimizer(model, cfg.trainer, cfg.trainer.lr)
    device = torch.device(cfg.trainer.device)
    rl_step(model, optimizer, batches[0], cfg.trainer, device)  # warm-up, as ours
    started, tokens = time.perf_counter(), 0
    for batch in batches[1:steps]:
        tokens += rl_step(model, optimizer, batch, cfg.trainer, device).tokens
    return tokens / (time.perf_counter() - started)


def command(
    config: ConfigPath = None,
    overrides: Overrides = None,
    steps: Annotated[int, typer.Option(help="steps per pass (the first is a warm-up)")] = 6,
    rounds: Annotated[int, typer.Option(help="passes of each path (alternating); medians reported")] = 3,
    tokens: Annotated[int, typer.Option(help="tokens per trajectory")] = 512,
    group_size: Annotated[int, typer.Option(help="trajectories per group")] = 8,
    model: Annotated[
        str | None, typer.Option(help="model directory or known name (default: a small one)")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="trainer.dtype: bf16 | fp32")] = None,
    lora_rank: Annotated[int | None, typer.Option(help="trainer.lora.rank (0: full fine-tuning)")] = None,
    ranks: Annotated[
        int, typer.Option(help="> 1: N data-parallel ranks (torchrun) against one rank (bench.trainer_ranks)")
    ] = 1,
) -> None:
    """Trainer tokens/s on Kafka vs a plain torch loop over the same batches (targets: ratio >= 0.9);
    with --ranks N, N data-parallel ranks vs one (target: ratio >= 0.8)."""
    extra = [f'trainer.dtype="{DTYPE_ALIASES.get(dtype, dtype)}"'] if dtype else []
    extra += [f"trainer.lora.rank={lora_rank}"] if lora_rank is not None else []
    cfg = read_config(config, [*(overrides or []), *extra])
    if ranks > 1 and steps < 3:
        fail("--ranks needs --steps >= 3: a warm-up, the step whose rank is killed, and one after it", code=2)
    ensure_local_broker(cfg)
    per_step = cfg.trainer.groups_per_step
    with tempfile.TemporaryDirectory(prefix="bench-model-") as scratch:
        base = resolve_model_dir(cfg, model) if model else init_model_dir(cfg.model, Path(scratch) / "model")
        vocab = read_model_config(base).model.vocab_size
        if ranks > 1:
            spec = _spec(vocab, (steps + 2) * per_step, tokens, group_size)
            bench = trainer_ranks.Bench(
                cfg,
                base,
                ranks,
                steps,
                kill_step=2,
                spec=spec,
                settings=(*(overrides or []), *extra),
                config=config,
            )
            _data_parallel(bench, rounds, model)
            return
        records = synthetic_groups(
            _spec(vocab, (steps + 2) * per_step, tokens, group_size)
        )  # more than consumed
        batches = _batches(records, per_step)
        ours: list[dict[str, float]] = []
        plain: list[float] = []
        peaks: dict[str, list[float]] = {"ours": [], "plain": []}
        for round_no in range(1, rounds + 1):
            with PeakRss() as peak:
                ours.append(asyncio.run(_ours(cfg, base, records, steps)))
            peaks["ours"].append(peak.peak_mb)
            with PeakRss() as peak:
                plain.append(run_on_compute(_plain, cfg, base, batches, steps))  # where ours steps
            peaks["plain"].append(peak.peak_mb)
            console.print(
                f"round {round_no}: trainer {ours[-1]['tokens_per_s']:,.0f} tokens/s, "
                f"plain {plain[-1]:,.0f} tokens/s"
            )
    figures = {key: statistics.median(r[key] for r in ours) for key in ours[0]}
    result = {
        "model": model or "small (model init)",
        "dtype": cfg.trainer.dtype,
        "lora_rank": cfg.trainer.lora.rank,
        "peak_rss_mb": round(max(peaks["ours"]), 1),
        "plain_peak_rss_mb": round(max(peaks["plain"]), 1),
        "tokens_per_s": round(figures["tokens_per_s"], 1),
        "plain_tokens_per_s": round(statistics.median(plain), 1),
        "ratio": round(figures["tokens_per_s"] / statistics.median(plain), 3),
        "step_s": round(figures["step_s"], 3),
        **{k: round(v, 4) for k, v in figures.items() if k.endswith("_share")},
    }
    print(json.dumps(result))


def _data_parallel(bench: trainer_ranks.Bench, rounds: int, model: str | None) -> None:
    """`--ranks N` (bench.trainer_ranks): its figures, then the JSON line."""
    figures = trainer_ranks.run(bench, rounds, console.print)
    head = {"model": model or "small (model init)", "dtype": bench.cfg.trainer.dtype}
    print(json.dumps({**head, "lora_rank": bench.cfg.trainer.lora.rank, **figures}))
