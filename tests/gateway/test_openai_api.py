"""The gateway driven by the official `openai` client, in front of the real engine (the tiny
default model) over HTTP: create, stream, logprobs, errors, authentication and deadlines.

The token ids an answer reports are the engine's own (checked against the same request sent to
the engine directly), and each call is written as a turn with exactly those ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest
from aiohttp import web

from agents.chat import ChatFormat
from agents.engine.engine import Engine
from agents.engine.protocol import SamplingParams
from agents.engine.server import create_app
from agents.settings import EngineSettings
from rollstream.launcher.process import free_port
from streams.payloads import Limits
from tests.gateway.conftest import MODEL, Served, gateway_over

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Say hi."}


def client_for(served: Served, sid: str, key: str, retries: int = 0) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=served.server.base_url(sid), api_key=key, max_retries=retries, timeout=120
    )


async def test_create_answers_with_the_engines_own_tokens(served: Served, chat: ChatFormat) -> None:
    session, written = served.open()
    async with client_for(served, session.sid, session.key) as client:
        answer = await client.chat.completions.create(
            model=MODEL, messages=[SYSTEM, USER], max_tokens=12, seed=7, extra_body={"return_token_ids": True}
        )
    prompt = chat.render_ids([SYSTEM, USER])
    params = SamplingParams(max_new_tokens=12, seed=7, stop_token_ids=chat.stop_token_ids)
    direct = await served.client.generate(prompt, params, "direct")
    choice = answer.choices[0]
    assert choice.prompt_token_ids == prompt  # type: ignore[attr-defined]
    assert choice.token_ids == list(direct.output_ids)  # type: ignore[attr-defined]
    assert choice.message.content == chat.reply_text(direct.output_ids)
    assert choice.finish_reason == ("length" if direct.finish_reason == "length" else "stop")
    assert answer.usage is not None and answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == len(direct.output_ids)
    assert answer.metadata == {"weight_version": "0"}  # type: ignore[comparison-overlap]
    [turn] = written.turns
    assert list(turn.observation_token_ids) == prompt  # a session's prompt is its first turn's observation
    assert tuple(turn.output_token_ids) == direct.output_ids
    assert tuple(turn.output_logprobs) == direct.output_logprobs
    assert turn.weight_version == 0 and turn.drift is None


async def test_stream_leaves_while_the_engine_generates_and_ends_with_the_same_answer(
    served: Served, chat: ChatFormat
) -> None:
    assert served.engine is not None
    asked = {"model": MODEL, "messages": [SYSTEM, USER], "max_tokens": 160, "seed": 3}
    first, plain_session = served.open(tid="plain"), served.open(tid="streamed")
    async with client_for(served, first[0].sid, first[0].key) as client:
        plain = await client.chat.completions.create(**asked, extra_body={"ignore_eos": True})
    session, written = plain_session
    running_at_first_chunk = None
    content, finish, usage = "", None, None
    async with client_for(served, session.sid, session.key) as client:
        stream = await client.chat.completions.create(
            **asked, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}
        )
        async for chunk in stream:
            if running_at_first_chunk is None:
                running_at_first_chunk = served.engine.stats().running
            if chunk.choices:
                content += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            usage = chunk.usage or usage
    assert running_at_first_chunk == 1, "the first chunk left only after the generation ended"
    assert content == plain.choices[0].message.content and finish == "length"
    assert usage is not None and usage.completion_tokens == 160
    assert len(written.turns[0].output_token_ids) == 160


async def test_logprobs_and_top_alternatives_are_the_engines(served: Served, chat: ChatFormat) -> None:
    session, written = served.open()
    async with client_for(served, session.sid, session.key) as client:
        answer = await client.chat.completions.create(
            model=MODEL,
            messages=[USER],
            max_tokens=6,
            logprobs=True,
            top_logprobs=3,
            extra_body={"ignore_eos": True},
        )
    content = answer.choices[0].logprobs.content  # type: ignore[union-attr]
    turn = written.turns[0]
    assert [c.logprob for c in content] == list(turn.output_logprobs)
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert bytes(entry.bytes or []).decode("utf-8", errors="replace") == entry.token


async def test_refused_requests_are_openai_errors_with_their_status(served: Served) -> None:
    session, written = served.open()
    async with client_for(served, session.sid, session.key) as client:
        for extra, param in (
            ({"n": 2}, "n"),
            ({"frequency_penalty": 0.5}, "frequency_penalty"),
            ({"tool_choice": "required", "tools": [_tool()]}, "tool_choice"),
        ):
            with pytest.raises(openai.BadRequestError) as refused:
                await client.chat.completions.create(model=MODEL, messages=[USER], **extra)
            assert refused.value.param == param and "not supported" in refused.value.message
        with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: foo"):
            await client.chat.completions.create(model=MODEL, messages=[USER], extra_body={"foo": 1})
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.chat.completions.create(model="gpt-4o", messages=[USER])
    assert written.turns == []


async def test_context_overflow_is_400_context_length_exceeded_and_ends_the_session(served: Served) -> None:
    session, _ = served.open()
    long = {"role": "user", "content": " ".join(f"w{i}" for i in range(3000))}  # over the engine's 2048
    async with client_for(served, session.sid, session.key) as client:
        with pytest.raises(openai.BadRequestError) as overflow:
            await client.chat.completions.create(model=MODEL, messages=[long])
        assert overflow.value.code == "context_length_exceeded" and overflow.value.status_code == 400
        with pytest.raises(openai.PermissionDeniedError, match="ended"):
            await client.chat.completions.create(model=MODEL, messages=[USER])
    assert session.outcome is not None and session.outcome.value == "truncated:context"


async def test_an_engine_failure_is_a_503_the_client_retries_and_the_session_survives(
    model_dir: Path, chat: ChatFormat
) -> None:
    """The engine is down for the first attempt (nothing listens on its port): a 503, which the
    openai client retries on its own; the engine comes up, the retry is answered, one turn is written."""
    port = free_port()
    engine = Engine(model_dir, EngineSettings(context_length=2048, torch_threads=1)).start()
    runner = web.AppRunner(create_app(engine))
    try:
        async with gateway_over(chat, f"http://127.0.0.1:{port}") as served:
            session, written = served.open()

            async def engine_up_after_a_503() -> None:
                while not served.gateway.metrics.calls["503"]:
                    await asyncio.sleep(0.02)
                await runner.setup()
                await web.TCPSite(runner, "127.0.0.1", port).start()

            starting = asyncio.create_task(engine_up_after_a_503())
            async with client_for(served, session.sid, session.key, retries=4) as client:
                answer = await client.chat.completions.create(model=MODEL, messages=[USER], max_tokens=3)
            await starting
    finally:
        await runner.cleanup()
        engine.stop()
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert served.gateway.metrics.calls["503"] >= 1 and served.gateway.metrics.calls["200"] == 1
    assert served.gateway.metrics.engine_errors["network"] >= 1 and session.counters.engine_errors >= 1
    [turn] = written.turns  # the failed attempts wrote nothing; the answered one is turn 1
    assert turn.turn == 1 and len(turn.output_token_ids) == answer.usage.completion_tokens  # type: ignore[union-attr]


async def test_keys_and_sessions_are_checked(served: Served) -> None:
    mine, _ = served.open(tid="mine")
    other, others_events = served.open(tid="other")
    async with client_for(served, mine.sid, other.key) as wrong_key:
        with pytest.raises(openai.AuthenticationError):
            await wrong_key.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2)
    async with client_for(served, "0" * 32, mine.key) as unknown:
        with pytest.raises(openai.NotFoundError):
            await unknown.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2)
    header = openai.AsyncOpenAI(
        base_url=f"{served.server.url}/v1", api_key=mine.key, default_headers={"X-Session-Id": mine.sid}
    )
    async with header:
        assert (await header.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2)).choices
        assert (await header.models.list()).data[0].id == MODEL
    served.gateway.close(mine.sid)
    async with client_for(served, mine.sid, mine.key) as ended:
        with pytest.raises(openai.PermissionDeniedError, match="ended"):
            await ended.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2)
    assert others_events.turns == []  # nothing reached the other trajectory


async def test_a_session_past_its_deadline_is_aborted_and_refused(served: Served) -> None:
    assert served.engine is not None
    session, written = served.open(timeout_s=1.5)
    async with client_for(served, session.sid, session.key) as client:
        with pytest.raises(openai.PermissionDeniedError, match="deadline"):
            await client.chat.completions.create(
                model=MODEL, messages=[USER], max_tokens=1900, extra_body={"ignore_eos": True}
            )
        with pytest.raises(openai.PermissionDeniedError):
            await client.chat.completions.create(model=MODEL, messages=[USER], max_tokens=2)
    assert written.turns == [] and session.outcome is not None and session.outcome.value == "truncated:time"
    for _ in range(100):
        if served.engine.stats().running == 0:
            break
        await asyncio.sleep(0.05)
    assert served.engine.stats().running == 0, "the aborted call kept generating"


async def test_a_call_cut_off_by_the_sessions_end_leaves_no_trace_beside_the_log(served: Served) -> None:
    """A drifted call in flight when the session ends writes no turn, so the session keeps no drift
    of it either: what the trajectory's finish counts (`session.drifts`) is what its turns show."""
    assert served.engine is not None
    session, written = served.open()
    async with client_for(served, session.sid, session.key) as client:
        first = await client.chat.completions.create(model=MODEL, messages=[SYSTEM, USER], max_tokens=4)
        context = session.context_tokens
        edited = [
            {"role": "system", "content": "You are verbose."},
            USER,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "go on"},
        ]
        call = asyncio.create_task(
            client.chat.completions.create(
                model=MODEL, messages=edited, max_tokens=1900, extra_body={"ignore_eos": True}
            )
        )
        for _ in range(600):
            if served.engine.stats().running or call.done():
                break
            await asyncio.sleep(0.05)
        served.gateway.close(session.sid)
        with pytest.raises(openai.PermissionDeniedError, match="closed"):
            await call
    assert len(written.turns) == 1 and session.drifts == [] and session.context_tokens == context
    assert served.gateway.metrics.drifts == {"edited": 1}  # the re-render happened, and is counted


async def test_limits_end_the_session_as_our_scaffold_does(served: Served) -> None:
    session, written = served.open(limits=Limits(max_turns=2))
    messages = [USER]
    async with client_for(served, session.sid, session.key) as client:
        for _ in range(2):
            answer = await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
            messages += [
                answer.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": "go"},
            ]
        with pytest.raises(openai.PermissionDeniedError, match="truncated:turns"):
            await client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
    assert len(written.turns) == 2 and all(t.drift is None for t in written.turns)


def _tool() -> dict[str, object]:
    return {"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}
