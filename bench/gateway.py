"""`rollstream bench gateway`: multi-turn sessions through the session gateway against the same
requests sent to the engine directly, in one run.

Two processes, started here: the embedded engine serving the default model (`rollstream model
init`'s, random weights), and a standalone gateway (`rollstream gateway serve`) in front of it,
writing every call to `rollout.events` on the local broker (fresh topics). The bench process
is the client, over plain aiohttp:

- direct: `--sessions` conversations of `--turns` turns, each turn one `/generate` of the whole
  context so far (token ids: the ids the gateway sends), fixed-length replies
  (`--reply-tokens`, no stop token), then a fixed tool observation appended with the model's
  chat template;
- gateway: the same conversations as OpenAI chat completions (`ignore_eos`, the same seeds), the
  history resent in full every turn, as agents do.

The two sides differ by one word of their system message, so neither's prefix cache entries
serve the other (the cache holds both). Turns run in lockstep, the sides taking turns (direct
then gateway on odd turns, the other way on even ones), so both meet the same machine load;
the gateway process's CPU time (user + system, from /proc) over its turn t, divided by the
calls, is its CPU per call at turn t.
Last line: {"sessions", "turns", "tokens_per_s", "direct_tokens_per_s", "ratio",
"cpu_ms_per_call_turn1", "cpu_ms_per_call_turn50", "cpu_growth", ...} with ratio = gateway /
direct tokens/s (target >= 0.9) and cpu_growth = turn `--turns` / turn 1 (target <= 1.5: no
history is re-tokenised).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import psutil
import typer

from agents.chat import ChatFormat
from agents.identity import sampling_seed
from bench.local_broker import ensure_local_broker, fresh_topics
from rollstream.command_line import ConfigPath, Overrides, console, read_config
from rollstream.config import Config
from rollstream.evaluation import wait_for_engine
from rollstream.launcher.process import free_port
from rollstream.supervisor import Supervisor
from streams.topics import delete_topics
from trainer.checkpoint import init_model_dir

SYSTEM = "You are a software engineer working in a bash shell."
TASK = "Fix the failing test in lib.py and submit."
TOKEN = "bench-gateway-admin"
TIMEOUT = aiohttp.ClientTimeout(total=600)


def observation(turn: int) -> str:
    return f"<returncode>0</returncode>\n<output>\nran step {turn}: 3 passed, 1 failed\n</output>"


@dataclass
class Phase:
    """One side's run: tokens, wall time and, for the gateway, its CPU seconds per turn."""

    tokens: int = 0
    wall_s: float = 0.0
    cpu_s: list[float] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


Call = Callable[[int, int], Awaitable[int]]


async def one_turn(phase: Phase, sessions: int, turn: int, call: Call, pid: int | None) -> None:
    """`call(session, turn)` for every session at once; its tokens, wall time and (gateway) CPU."""
    before, started = (cpu_seconds(pid) if pid else 0.0), time.monotonic()
    produced = await asyncio.gather(*(call(s, turn) for s in range(sessions)))
    phase.wall_s += time.monotonic() - started
    phase.tokens += sum(produced)
    if pid:
        phase.cpu_s.append(cpu_seconds(pid) - before)


def direct_calls(http: aiohttp.ClientSession, url: str, chat: ChatFormat, args: BenchArgs) -> Call:
    contexts = [chat.prompt(f"{SYSTEM} (direct)", TASK) for _ in range(args.sessions)]

    async def call(session: int, turn: int) -> int:
        body = {
            "input_ids": contexts[session],
            "sampling_params": {
                "max_new_tokens": args.reply_tokens,
                "temperature": 1.0,
                "sampling_seed": sampling_seed(f"bench-{session}", turn),
            },
            "return_logprob": True,
            "rid": f"direct-{session}-{turn}",
        }
        async with http.post(f"{url}/generate", json=body) as reply:
            output = (await reply.json())["output_ids"]
        contexts[session] = [*contexts[session], *output, *chat.observation(output, observation(turn))]
        return len(output)

    return call


def gateway_calls(
    http: aiohttp.ClientSession, url: str, model: str, args: BenchArgs, sessions: list[tuple[str, str]]
) -> Call:
    histories: list[list[dict[str, Any]]] = [
        [{"role": "system", "content": f"{SYSTEM} (gateway)"}, {"role": "user", "content": TASK}]
        for _ in sessions
    ]

    async def call(session: int, turn: int) -> int:
        sid, key = sessions[session]
        body = {
            "model": model,
            "messages": histories[session],
            "max_tokens": args.reply_tokens,
            "temperature": 1.0,
            "seed": sampling_seed(f"bench-{session}", turn),
            "ignore_eos": True,
        }
        headers = {"Authorization": f"Bearer {key}"}
        async with http.post(
            f"{url}/sessions/{sid}/v1/chat/completions", json=body, headers=headers
        ) as reply:
            answer = await reply.json()
        if "choices" not in answer:
            raise RuntimeError(f"the gateway refused a call: {answer}")
        message = answer["choices"][0]["message"]
        histories[session] += [message, {"role": "user", "content": observation(turn)}]
        return int(answer["usage"]["completion_tokens"])

    return call


async def both_sides(direct: Call, gateway: Call, args: BenchArgs, pid: int) -> tuple[Phase, Phase]:
    """Each turn on both sides, the order alternating, so both meet the same machine load."""
    sides = (Phase(), Phase())
    for turn in range(1, args.turns + 1):
        order = (0, 1) if turn % 2 else (1, 0)
        for side in order:
            await one_turn(sides[side], args.sessions, turn, (direct, gateway)[side], pid if side else None)
        if turn % 10 == 0:
            console.print(
                f"turn {turn}: direct {sides[0].tokens_per_s:.0f} tok/s, gateway {sides[1].tokens_per_s:.0f}"
            )
    return sides


async def open_session(http: aiohttp.ClientSession, url: str, index: int) -> tuple[str, str]:
    body = {"run_id": "bench-gateway", "task_id": f"task-{index}", "limits": {"max_turns": 1000}}
    opened = await post(http, f"{url}/sessions", body)
    return opened["session_id"], opened["api_key"]


async def post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(url, json=body, headers={"Authorization": f"Bearer {TOKEN}"}) as reply:
        answer: dict[str, Any] = await reply.json()
        if reply.status >= 400:
            raise RuntimeError(f"{url}: {reply.status} {answer}")
        return answer


@dataclass(frozen=True)
class BenchArgs:
    sessions: int
    turns: int
    reply_tokens: int


def figures(args: BenchArgs, direct: Phase, gateway: Phase) -> dict[str, Any]:
    per_call = [cpu / args.sessions * 1000 for cpu in gateway.cpu_s]
    return {
        "sessions": args.sessions,
        "turns": args.turns,
        "tokens_per_s": round(gateway.tokens_per_s, 1),
        "direct_tokens_per_s": round(direct.tokens_per_s, 1),
        "ratio": round(gateway.tokens_per_s / direct.tokens_per_s, 3) if direct.tokens_per_s else 0.0,
        "cpu_ms_per_call_turn1": round(per_call[0], 3),
        f"cpu_ms_per_call_turn{args.turns}": round(per_call[-1], 3),
        "cpu_growth": round(per_call[-1] / per_call[0], 3) if per_call[0] else 0.0,
        "cpu_ms_per_call_by_turn": [round(x, 2) for x in per_call],
        "reply_tokens": args.reply_tokens,
        "load_1m": round(os.getloadavg()[0], 2),
    }


async def run(cfg: Config, args: BenchArgs, work: Path) -> dict[str, Any]:
    model_dir = init_model_dir(cfg.model, work / "model")
    chat = ChatFormat.from_model_dir(model_dir)
    topics = await fresh_topics(cfg, "bench-gateway")
    engine_port, gateway_port = free_port(), free_port()
    engine_url, gateway_url = f"http://127.0.0.1:{engine_port}", f"http://127.0.0.1:{gateway_port}"
    context = args.turns * (args.reply_tokens + 64) + 512
    sets = [
        f'topics.prefix="{topics.prefix}"',
        f"engine.context_length={context}",
        f"engine.max_running_requests={args.sessions}",
        f"engine.kv_cache_tokens={2 * args.sessions * context}",
        f"engine.prefix_cache_tokens={2 * args.sessions * context}",  # both sides' contexts stay cached
        f'run.state_dir="{work}"',
    ]
    os.environ[cfg.gateway.admin_token_env] = TOKEN
    try:
        with Supervisor(work / "logs", [a for s in sets for a in ("--set", s)], restart=False) as pipeline:
            pipeline.start(
                "engine", ["engine", "serve", "--model", str(model_dir), "--port", str(engine_port)]
            )
            await wait_for_engine(engine_url, cfg.eval.engine_start_timeout_s, pipeline.check_alive)
            serve = ["gateway", "serve", "--engine", engine_url, "--model", str(model_dir)]
            gateway = pipeline.start("gateway", [*serve, "--port", str(gateway_port)])
            await wait_for_engine(gateway_url, cfg.eval.engine_start_timeout_s, pipeline.check_alive)
            async with aiohttp.ClientSession(timeout=TIMEOUT) as http:
                sessions = [await open_session(http, gateway_url, s) for s in range(args.sessions)]
                console.print(f"{args.sessions} sessions x {args.turns} turns, each side in turn")
                direct, through = await both_sides(
                    direct_calls(http, engine_url, chat, args),
                    gateway_calls(http, gateway_url, model_dir.name, args, sessions),
                    args,
                    gateway.pid,
                )
                for sid, _ in sessions:
                    await post(http, f"{gateway_url}/sessions/{sid}/close", {"reward": 0.0})
    finally:
        await delete_topics(cfg.kafka, topics)
    return figures(args, direct, through)


def command(
    sessions: Annotated[int, typer.Option("--sessions", min=1, help="concurrent sessions")] = 64,
    turns: Annotated[int, typer.Option("--turns", min=2, help="turns per session")] = 50,
    reply_tokens: Annotated[int, typer.Option("--reply-tokens", min=1, help="tokens per reply")] = 16,
    config: ConfigPath = None,
    overrides: Overrides = None,
) -> None:
    """Sessions through the gateway against the same requests to the engine directly (last line JSON)."""
    cfg = read_config(config, overrides)
    ensure_local_broker(cfg)
    args = BenchArgs(sessions, turns, reply_tokens)
    with tempfile.TemporaryDirectory(prefix="rollstream-bench-gateway-") as work:
        result = asyncio.run(run(cfg, args, Path(work)))
    print(json.dumps(result))
