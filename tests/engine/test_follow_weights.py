"""Engines follow weight versions from the `weights` topic (agents.engine.follow), on the real
broker with the real engine: versions are real model directories written by `save_version` and
announced by the trainer's own `trainer.publish.announce`."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp import web
from typer.testing import CliRunner

from agents.engine.follow import (
    EmbeddedTarget,
    WeightsFollower,
    follow_in_app,
    http_targets,
    version_to_load,
)
from agents.engine.protocol import SamplingParams
from agents.settings import FollowSettings
from rollstream.commands.weights import app as weights_app
from rollstream.config import Config, load_config
from rollstream.weights_follow import follow_engines
from streams.bus import EventProducer
from tests.engine.conftest import EngineFactory
from tests.engine.test_cli import flat, free_port
from tests.engine.test_engine import TIMEOUT, full_forward_logprobs, prompt
from tests.engine.test_server import serving, wait_for
from trainer.checkpoint import load_model, save_version
from trainer.model import KVCache, build_model
from trainer.publish import PublishedVersion, announce
from trainer.versions import directory_sha256, version_dir

RUN = "run-follow"
FAST = FollowSettings(poll_ms=50, retry_s=0.2)
HTTP_TIMEOUT = aiohttp.ClientTimeout(total=TIMEOUT)


def write(weights_dir: Path, base_dir: Path, version: int) -> PublishedVersion:
    """A complete directory for `version` (the base's tokenizer, new random weights) and its checksum.
    Not `trainer.publish.write_version`: its meta-device model costs a one-time import of torch._refs
    (~900 modules, tens of seconds on a busy machine)."""
    model = build_model(load_model(base_dir).config, seed=100 + version)
    path = save_version(model, base_dir, version_dir(weights_dir, RUN, version), version)
    return PublishedVersion(version, path, directory_sha256(path), existed=False)


async def publish(config: Config, published: PublishedVersion) -> None:
    """The trainer's announcement: `weights` (compacted, keyed by run) and `weights.history`."""
    async with EventProducer(config.kafka, config.topics) as producer:
        await announce(producer, RUN, published, step=published.version)


def follower_of(config: Config, targets: list, sync_every: int = 1) -> WeightsFollower:  # type: ignore[type-arg]
    return WeightsFollower(config.kafka, config.topics, RUN, targets, sync_every=sync_every, settings=FAST)


@asynccontextmanager
async def following(follower: WeightsFollower) -> AsyncIterator[WeightsFollower]:
    stop = asyncio.Event()
    task = asyncio.create_task(follower.run(stop))
    try:
        yield follower
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)  # re-raises what the follower died of


async def until(condition: Callable[[], bool], what: str) -> None:
    await wait_for(condition, what, timeout=TIMEOUT)


def switched_logprobs(
    old_dir: Path, new_dir: Path, input_ids: list[int], output_ids: tuple[int, ...], switch: int
) -> list[float]:
    """Logprobs of output_ids[switch:] as an in-place swap computes them: the new weights attend
    to the keys/values the old weights cached (the prompt and output_ids[:switch - 1])."""
    old, new = load_model(old_dir), load_model(new_dir)
    ids = input_ids + list(output_ids)
    cached = len(input_ids) + switch - 1
    cache = KVCache.empty(old.config, 1, len(ids), torch.float32)
    with torch.no_grad():
        old.forward_cached(torch.tensor([ids[:cached]]), torch.tensor([0]), cache)
        logits = new.forward_cached(torch.tensor([ids[cached:-1]]), torch.tensor([cached]), cache)[0]
    logprobs = torch.log_softmax(logits, dim=-1)
    return [logprobs[i, token].item() for i, token in enumerate(output_ids[switch:])]


@pytest.mark.parametrize(
    ("served", "available", "sync_every", "expected"),
    [
        (0, [], 1, None),
        (0, [1], 1, 1),
        (0, [1, 2, 3], 1, 3),  # the newest, not each in turn
        (3, [1, 2, 3], 1, None),  # nothing newer than what is served
        (0, [1], 2, None),  # not due, and only one version behind
        (0, [1, 2], 2, 2),
        (2, [3], 2, None),
        (2, [3, 4, 5], 2, 4),  # due beats newest: every engine serves the same versions
        (0, [5], 2, 5),  # joined late on a compacted topic: catch up to the newest
        (2, [5], 4, None),  # 3 behind with sync_every 4: wait for 8 (or 6 behind)
        (1, [3], 3, 3),
        (4, [5, 6, 7, 9], 4, 9),  # 8 was refused (not available): catch up rather than lag on
    ],
)
def test_version_to_load(served: int, available: list[int], sync_every: int, expected: int | None) -> None:
    assert version_to_load(served, available, sync_every) == expected


def test_version_to_load_refuses_a_bad_sync_every() -> None:
    with pytest.raises(ValueError, match="sync_every must be >= 1"):
        version_to_load(0, [1], 0)


async def test_in_flight_generation_switches_to_the_published_version(
    make_engine: EngineFactory, model_dir: Path, kafka_config: Config, tmp_path: Path
) -> None:
    engine = make_engine(context_length=16384)
    v1 = write(tmp_path / "weights", model_dir, 1)
    input_ids = prompt(12)
    async with following(follower_of(kafka_config, [EmbeddedTarget(engine)])) as follower:
        future = engine.submit("long", input_ids, SamplingParams(max_new_tokens=16000, seed=3))
        await until(lambda: engine.stats().generated_tokens >= 20, "tokens under version 0")
        await publish(kafka_config, v1)
        await until(lambda: engine.weight_version == 1, "the follower to swap in version 1")
        after = engine.stats().generated_tokens
        await until(lambda: engine.stats().generated_tokens >= after + 20, "tokens under version 1")
        engine.abort("long")
        result = await asyncio.wrap_future(future)
    assert follower.loads == [("embedded", 1)] and not follower.refused
    versions = list(result.output_versions)
    switch = versions.index(1)
    assert 20 <= switch < len(versions) - 20 < 16000
    assert versions == [0] * switch + [1] * (len(versions) - switch)  # exactly one switch point
    logprobs = list(result.output_logprobs)
    before = full_forward_logprobs(model_dir, input_ids, result.output_ids[:switch])
    assert max(abs(a - b) for a, b in zip(before, logprobs[:switch], strict=True)) < 1e-4
    new = switched_logprobs(model_dir, v1.path, input_ids, result.output_ids, switch)
    assert max(abs(a - b) for a, b in zip(new, logprobs[switch:], strict=True)) < 1e-4
    old = full_forward_logprobs(model_dir, input_ids, result.output_ids)[switch:]
    assert max(abs(a - b) for a, b in zip(old, logprobs[switch:], strict=True)) > 1e-2  # not the old weights


async def test_http_follower_updates_every_server(
    make_engine: EngineFactory, model_dir: Path, kafka_config: Config, tmp_path: Path
) -> None:
    v1 = write(tmp_path / "weights", model_dir, 1)
    async with (
        serving(make_engine()) as first,
        serving(make_engine()) as second,
        aiohttp.ClientSession(timeout=HTTP_TIMEOUT) as http,
        http_targets([first, second], FAST) as targets,
        following(follower_of(kafka_config, targets)) as follower,
    ):
        await until(lambda: follower.served == {first: 0, second: 0}, "the served versions (/get_model_info)")
        await publish(kafka_config, v1)
        await until(lambda: len(follower.loads) == 2, "both servers to load version 1")
        for url in (first, second):
            async with http.get(f"{url}/get_model_info") as reply:
                info = await reply.json()
            assert info["weight_version"] == "1" and info["model_path"] == str(v1.path)
            request = {"input_ids": prompt(6), "sampling_params": {"max_new_tokens": 4}}
            async with http.post(f"{url}/generate", json=request) as reply:
                meta = (await reply.json())["meta_info"]
            assert meta["weight_version"] == "1" and meta["output_token_versions"] == [1] * 4
    assert sorted(follower.loads) == sorted([(first, 1), (second, 1)])


async def test_a_directory_that_does_not_match_its_checksum_is_refused(
    make_engine: EngineFactory,
    model_dir: Path,
    kafka_config: Config,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = make_engine()
    weights = tmp_path / "weights"
    v1, v2 = write(weights, model_dir, 1), write(weights, model_dir, 2)
    with open(v1.path / "generation_config.json", "a") as changed:  # changed after it was announced
        changed.write(" ")
    caplog.set_level(logging.ERROR, logger="agents.engine.follow")
    async with following(follower_of(kafka_config, [EmbeddedTarget(engine)])) as follower:
        await publish(kafka_config, v1)
        await until(lambda: 1 in follower.refused, "version 1 to be refused")
        assert engine.weight_version == 0 and follower.loads == []
        assert "does not match the published" in follower.refused[1]
        assert any("REFUSED weight version 1" in record.getMessage() for record in caplog.records)
        await publish(kafka_config, v2)
        await until(lambda: engine.weight_version == 2, "version 2 to be loaded")
    assert follower.loads == [("embedded", 2)]


async def test_sync_every_2_loads_only_every_second_version(
    make_engine: EngineFactory, model_dir: Path, kafka_config: Config, tmp_path: Path
) -> None:
    engine = make_engine()
    versions = [write(tmp_path / "weights", model_dir, v) for v in (1, 2, 3, 4)]
    async with following(follower_of(kafka_config, [EmbeddedTarget(engine)], sync_every=2)) as follower:
        for published in versions:
            version = published.version
            await publish(kafka_config, published)
            await until(lambda v=version: follower.newest_seen == v, f"version {version} to arrive")
            if version % 2 == 0:
                await until(lambda v=version: engine.weight_version == v, f"version {version} to load")
            else:
                await asyncio.sleep(3 * FAST.poll_ms / 1000)  # a few polls in which it must not load
                assert engine.weight_version == version - 1
    assert follower.loads == [("embedded", 2), ("embedded", 4)]
    fresh = engine.submit("fresh", prompt(5), SamplingParams(max_new_tokens=3)).result(TIMEOUT)
    assert fresh.output_versions == (4, 4, 4)


def cli(*arguments: str) -> list[str]:
    return [sys.executable, "-c", "from rollstream.cli import app; app()", *arguments]


def bus_overrides(config: Config) -> list[str]:
    settings = [
        f'kafka.bootstrap="{config.kafka.bootstrap}"',
        f'topics.prefix="{config.topics.prefix}"',
        "follow.poll_ms=100",
        "follow.retry_s=0.5",
    ]
    return [word for setting in settings for word in ("-s", setting)]


async def model_info(http: aiohttp.ClientSession, url: str) -> dict[str, object] | None:
    try:
        async with http.get(f"{url}/get_model_info") as reply:
            return await reply.json()
    except aiohttp.ClientError:
        return None


async def stopped(process: asyncio.subprocess.Process) -> tuple[int, str]:
    """SIGINT, then the exit code and output, whitespace collapsed (killed after 30 s)."""
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
    try:
        output, _ = await asyncio.wait_for(process.communicate(), 30)
    except TimeoutError:
        process.kill()
        output, _ = await process.communicate()
    return process.returncode if process.returncode is not None else -1, flat(output.decode())


async def test_engine_serve_follow_weights(model_dir: Path, kafka_config: Config, tmp_path: Path) -> None:
    v1 = write(tmp_path / "weights", model_dir, 1)
    url = f"http://127.0.0.1:{(port := free_port())}"
    arguments = ["engine", "serve", "--model", str(model_dir), "--port", str(port), "--follow-weights", RUN]
    server = await asyncio.create_subprocess_exec(
        *cli(*arguments, *bus_overrides(kafka_config)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            deadline = time.monotonic() + 180
            while (info := await model_info(http, url)) is None:
                assert server.returncode is None and time.monotonic() < deadline, "engine serve is not up"
                await asyncio.sleep(0.5)
            assert info["weight_version"] == "0"
            await publish(kafka_config, v1)
            while (info := await model_info(http, url)) is None or info["weight_version"] != "1":
                assert time.monotonic() < deadline, f"engine serve did not load version 1: {info}"
                await asyncio.sleep(0.2)
    finally:
        code, output = await stopped(server)
    assert code == 0, output
    assert f"following weights of run {RUN!r}" in output and "weight version 0 -> 1" in output


async def test_weights_follow_command_catches_up_from_the_start(
    make_engine: EngineFactory, model_dir: Path, kafka_config: Config, tmp_path: Path
) -> None:
    """`rollstream weights follow`'s work, in process (a subprocess costs a torch import): the
    version published before it started is loaded, with `trainer.sync_every` from the config."""
    config = kafka_config.with_overrides(["trainer.sync_every=2", "follow.poll_ms=50"])
    refused = CliRunner().invoke(weights_app, ["follow", "--run", " ", "-s", "follow.poll_ms=50"])
    assert refused.exit_code == 1 and "--run is empty" in flat(refused.output)
    engine = make_engine()
    for version in (4, 5):  # with sync_every 2, the due 4 and not the newest 5
        await publish(config, write(tmp_path / "weights", model_dir, version))
    stop = asyncio.Event()
    async with serving(engine) as url:
        task = asyncio.create_task(follow_engines(config, RUN, [url], stop))
        await until(lambda: engine.weight_version == 4 or task.done(), "version 4")
        await asyncio.sleep(3 * FAST.poll_ms / 1000)  # a few polls in which 5 must not be loaded
        stop.set()
        follower = await asyncio.wait_for(task, 60)
    assert follower.loads == [(url, 4)] and follower.served == {url: 4} and engine.weight_version == 4


async def test_inside_a_server_a_lost_broker_is_retried(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(None, ['kafka.bootstrap="127.0.0.1:9"'])  # nothing listens there
    follower = follower_of(config, [EmbeddedTarget(make_engine())])
    caplog.set_level(logging.ERROR, logger="agents.engine.follow")
    context = follow_in_app(follower)(web.Application())
    await anext(context)  # the server starts: the follower runs beside it

    def attempts() -> int:
        return sum("lost the broker" in record.getMessage() for record in caplog.records)

    await until(lambda: attempts() >= 2, "a second attempt after the first failed")
    with pytest.raises(StopAsyncIteration):
        await anext(context)  # the server stops: so does the follower
