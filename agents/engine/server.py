"""The embedded engine over HTTP, with SGLang's request and response contract.

Field names follow SGLang's own definitions in `python/sglang/srt/managers/io_struct.py`
(`GenerateReqInput`, `AbortReq`, `PauseGenerationReqInput`, `UpdateWeightFromDiskReqInput`)
and the finish reasons of `schedule_batch.py` (`FINISH_MATCHED_TOKEN` → {"type": "stop",
"matched": id}, `FINISH_LENGTH` → {"type": "length", "length": n}, `FINISH_ABORT` →
{"type": "abort", "message": ...}), matched against sgl-project/sglang main (io_struct.py at
commit 001067ff, sampling_params.py at 00c17caf: the 0.5.x line, with `sampling_seed` and
`weight_version`), read as source, not installed.

Routes: POST /generate, POST /abort_request, POST /pause_generation, POST
/continue_generation, POST /update_weights_from_disk, POST|GET /flush_cache, GET
/health, GET /health_generate, GET /get_model_info, and our GET /engine_stats.

/generate accepts one request of `input_ids` (no text, no batches), `sampling_params`
{max_new_tokens, temperature, top_p, top_k, stop_token_ids, sampling_seed}, `rid`,
`return_logprob`, `top_logprobs_num` and `stream`, and answers `output_ids`, `text` and
`meta_info` {id, finish_reason, prompt_tokens, completion_tokens, cached_tokens,
weight_version (a string, as SGLang), output_token_logprobs ([logprob, token_id, null] per
token, when asked), output_top_logprobs (per token, a list of [logprob, token_id, null],
when top_logprobs_num > 0), e2e_latency} plus our `output_token_versions` and `queue_time`.
With `stream: true` the answer is server-sent events as tokens are sampled, each one such
object for the tokens new since the previous event (SGLang with
`--incremental-streaming-output`; `agents.engine.streaming`), then `data: [DONE]`.
Input at or over the context cap → 400 {"error": {"message", "type":
"context_length_exceeded"}}; a full queue → 503. A request the engine drops because it is
stopping (SIGTERM: a restart, the end of a run) → 503 "engine_stopping", never a finish
reason "abort": only an abort a client asked for is one.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from aiohttp import web
from tokenizers import Tokenizer

from agents.engine.engine import Engine
from agents.engine.errors import (
    ContextLengthError,
    EngineFailure,
    EngineRefusal,
    EngineStopping,
    QueueFullError,
)
from agents.engine.protocol import SamplingParams
from agents.engine.streaming import TokenQueue, stream_result
from agents.engine.wire import generate_response
from agents.settings import EngineSettings
from streams.heartbeat import start_heartbeat
from trainer.tokenizer import load_tokenizer

ENGINE_KEY: web.AppKey[Engine] = web.AppKey("engine", Engine)


@dataclass
class ServerInfo:
    """What the server knows beyond the engine: its id, the served path, the tokenizer for `text`."""

    engine_id: str
    model_path: str
    tokenizer: Tokenizer | None


INFO_KEY: web.AppKey[ServerInfo] = web.AppKey("info", ServerInfo)


def error_response(status: int, message: str, kind: str) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind}}, status=status)


SUPPORTED_SAMPLING = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "sampling_seed"}
# SGLang options accepted only at their defaults (they change sampling in ways we do not implement).
DEFAULT_ONLY_SAMPLING: dict[str, object] = {
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
    "min_new_tokens": 0,
    "n": 1,
    "ignore_eos": False,
    "stop": None,
    "stop_regex": None,
    "json_schema": None,
    "regex": None,
    "ebnf": None,
    "structural_tag": None,
    "logit_bias": None,
}
# SGLang options about detokenised text or streaming: no effect on tokens, ignored.
IGNORED_SAMPLING = {"skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "stream_interval"}


def parse_sampling(raw: dict[str, Any]) -> SamplingParams:
    """SGLang's sampling_params → SamplingParams. As in SGLang, null means the default and a
    temperature below 1e-6 is greedy; options we do not implement are refused unless at default."""
    unknown = sorted(set(raw) - SUPPORTED_SAMPLING - set(DEFAULT_ONLY_SAMPLING) - IGNORED_SAMPLING)
    if unknown:
        raise ValueError(f"unsupported sampling_params {unknown}; supported: {sorted(SUPPORTED_SAMPLING)}")
    changed = sorted(
        key for key, default in DEFAULT_ONLY_SAMPLING.items() if raw.get(key) not in (None, default)
    )
    if changed:
        raise ValueError(f"sampling_params {changed} are only supported at their defaults")

    def value(key: str, default: Any) -> Any:
        return default if raw.get(key) is None else raw[key]

    temperature = float(value("temperature", 1.0))
    return SamplingParams(
        max_new_tokens=int(value("max_new_tokens", 128)),
        temperature=0.0 if 0 <= temperature < 1e-6 else temperature,
        top_p=float(value("top_p", 1.0)),
        top_k=int(value("top_k", -1)),
        seed=None if raw.get("sampling_seed") is None else int(raw["sampling_seed"]),
        stop_token_ids=tuple(int(t) for t in value("stop_token_ids", ())),
    )


@dataclass(frozen=True)
class GenerateRequest:
    """A /generate body, checked."""

    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    stream: bool


def parse_generate(body: Any) -> GenerateRequest:
    """SGLang's GenerateReqInput (one request of input_ids) checked; ValueError says what is wrong."""
    if not isinstance(body, dict):
        raise ValueError("the body must be a JSON object")
    input_ids = body.get("input_ids")
    if body.get("text") is not None or not isinstance(input_ids, list) or not input_ids:
        raise ValueError(
            "send one request as input_ids (a non-empty list of ints); "
            "text and batched input are not supported"
        )
    if not all(isinstance(token, int) for token in input_ids):
        raise ValueError("input_ids must be a list of ints (batched input is not supported)")
    try:
        params = parse_sampling(body.get("sampling_params") or {})
        top = int(body.get("top_logprobs_num") or 0)
        params = replace(params, top_logprobs=top) if top else params
    except (TypeError, ValueError) as error:
        raise ValueError(f"bad sampling_params: {error}") from None
    rid = str(body.get("rid") or uuid.uuid4().hex)
    return GenerateRequest(rid, input_ids, params, bool(body.get("return_logprob")), bool(body.get("stream")))


def submit_error(error: Exception) -> web.Response:
    """The HTTP answer to a request the engine refused or could not finish."""
    if isinstance(error, ContextLengthError):
        return error_response(400, str(error), "context_length_exceeded")
    if isinstance(error, QueueFullError):
        return error_response(503, str(error), "queue_full")
    if isinstance(error, EngineRefusal):
        return error_response(400, str(error), "invalid_request")
    if isinstance(error, EngineStopping):
        return error_response(503, str(error), "engine_stopping")
    return error_response(500, str(error), "engine_failure")


async def generate(request: web.Request) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    try:
        asked = parse_generate(await request.json())
    except ValueError as error:
        return error_response(400, str(error), "invalid_request")
    info = request.app[INFO_KEY]
    tokens = TokenQueue() if asked.stream else None
    try:
        future = engine.submit(asked.rid, asked.input_ids, asked.params, tokens.listener if tokens else None)
    except (EngineRefusal, EngineStopping) as error:
        return submit_error(error)
    if tokens is not None:
        prompt, logprobs = len(asked.input_ids), asked.return_logprob
        tokenizer = info.tokenizer
        return await stream_result(request, engine, asked.rid, prompt, future, tokens, tokenizer, logprobs)
    try:
        result = await asyncio.wrap_future(future)
    except (EngineStopping, EngineFailure) as error:
        return submit_error(error)
    text = info.tokenizer.decode(list(result.output_ids), skip_special_tokens=False) if info.tokenizer else ""
    return web.json_response(generate_response(result, asked.return_logprob, text))


async def abort_request(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await request.json() if request.can_read_body else {}
    if body.get("abort_all"):
        engine.abort_all()
    elif body.get("rid"):
        engine.abort(str(body["rid"]))
    return web.Response(status=200)


async def pause_generation(request: web.Request) -> web.Response:
    body = await request.json() if request.can_read_body else {}
    mode = body.get("mode", "abort")
    if mode not in ("abort", "retract", "in_place"):
        message = f"mode must be abort, retract or in_place, got {mode!r}"
        return error_response(400, message, "invalid_request")
    # "retract" and "in_place" both keep requests and their caches here: nothing needs the memory.
    request.app[ENGINE_KEY].pause(abort_running=mode == "abort")
    return web.json_response({"message": "Generation paused successfully."})


async def continue_generation(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].resume()
    return web.json_response({"message": "Generation continued successfully."})


async def update_weights_from_disk(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    body = await request.json()
    model_path = body.get("model_path")
    raw_version = body.get("weight_version")
    if not model_path:
        return error_response(400, "model_path is required", "invalid_request")
    try:
        version = None if raw_version is None else int(raw_version)
    except ValueError:
        message = f"weight_version must be an integer, got {raw_version!r}"
        return error_response(400, message, "invalid_request")
    if body.get("abort_all_requests"):
        engine.abort_all()
    try:
        future = await asyncio.to_thread(engine.update_weights, Path(model_path), version)
        applied = await asyncio.wrap_future(future)
    except (OSError, ValueError) as error:
        return web.json_response({"success": False, "message": str(error), "num_paused_requests": 0})
    request.app[INFO_KEY].model_path = str(model_path)
    return web.json_response(
        {
            "success": True,
            "message": f"Succeeded to update model weights (version {applied}).",
            "num_paused_requests": 0,
        }
    )


async def flush_cache(request: web.Request) -> web.Response:
    request.app[ENGINE_KEY].flush_cache()
    return web.Response(text="Cache flushed.\n")


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def health_generate(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    if engine.stats().paused:
        return web.Response(status=200)  # alive; generation is paused on purpose
    try:
        future = engine.submit(f"health-{uuid.uuid4().hex}", [0], SamplingParams(max_new_tokens=1))
    except (EngineRefusal, EngineStopping) as error:
        return web.Response(status=503, text=str(error))
    try:
        await asyncio.wait_for(asyncio.wrap_future(future), engine.settings.health_timeout_s)
    except TimeoutError:
        return web.Response(status=503, text="engine did not generate a token in time")
    except EngineStopping as error:
        return web.Response(status=503, text=str(error))
    return web.Response(status=200)


async def get_model_info(request: web.Request) -> web.Response:
    engine = request.app[ENGINE_KEY]
    info = request.app[INFO_KEY]
    return web.json_response(
        {
            "model_path": info.model_path,
            "tokenizer_path": info.model_path,
            "is_generation": True,
            "weight_version": str(engine.weight_version),
            "context_length": engine.settings.context_length,
            "max_running_requests": engine.settings.max_running_requests,
            "engine_id": info.engine_id,
        }
    )


async def engine_stats(request: web.Request) -> web.Response:
    stats = request.app[ENGINE_KEY].stats()
    return web.json_response(asdict(stats))


def create_app(engine: Engine, engine_id: str = "") -> web.Application:
    """An aiohttp app serving `engine` (already started; stopped when the app shuts down)."""
    app = web.Application(client_max_size=256 * 1024 * 1024)
    app[ENGINE_KEY] = engine
    try:
        tokenizer = load_tokenizer(engine.model_dir)
    except FileNotFoundError:
        tokenizer = None
    app[INFO_KEY] = ServerInfo(engine_id=engine_id, model_path=str(engine.model_dir), tokenizer=tokenizer)
    app.router.add_post("/generate", generate)
    app.router.add_post("/abort_request", abort_request)
    app.router.add_post("/pause_generation", pause_generation)
    app.router.add_post("/continue_generation", continue_generation)
    app.router.add_post("/update_weights_from_disk", update_weights_from_disk)
    app.router.add_route("*", "/flush_cache", flush_cache)
    app.router.add_get("/health", health)
    app.router.add_get("/health_generate", health_generate)
    app.router.add_get("/get_model_info", get_model_info)
    app.router.add_get("/engine_stats", engine_stats)

    async def stop_engine(_: web.Application) -> None:
        await asyncio.to_thread(engine.stop)

    async def beat(_: web.Application) -> None:  # from the HTTP loop, while the scheduler answers
        start_heartbeat(check=lambda: engine.stats().decode_steps >= 0)

    app.on_startup.append(beat)
    app.on_shutdown.append(stop_engine)
    return app


def serve(model_dir: Path, settings: EngineSettings) -> None:
    """Run an engine server until interrupted (the `rollstream engine serve` command)."""
    engine = Engine(model_dir, settings).start()
    engine_id = f"http://{settings.host}:{settings.port}"
    web.run_app(create_app(engine, engine_id), host=settings.host, port=settings.port, print=None)
