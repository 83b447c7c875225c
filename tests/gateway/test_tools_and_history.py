"""Tool calls, stop strings and history through the gateway, with a scripted model served over the
real engine protocol (its replies are known, so what the gateway makes of them can be checked):

- a `<tool_call>` reply comes back as `tool_calls` (plain and streamed), the tool result is
  appended by the template after the engine's ids, and a malformed call is content, counted;
- a stop string cuts the answer (and the kept tokens) where it starts;
- a history that extends the last one is never rendered again; one the client changed is
  re-rendered, recorded as a drift on the turn, and folds with the gone tokens masked."""

from __future__ import annotations

import json

import openai

from agents.chat import ChatFormat
from agents.chat_tools import parse_tool_calls
from agents.scripted import ScriptedPolicy
from streams.assemble import Trajectory, fold_trajectory
from streams.events import Event, make_event
from streams.outcomes import Outcome
from streams.payloads import Limits, TrajectoryFinished, TrajectoryStarted
from tests.gateway.conftest import MODEL, Served, Written, scripted

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Execute a bash command",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls -la"}}\n</tool_call>'
SYSTEM = {"role": "system", "content": "You are a helpful assistant that can interact with a computer."}
TASK = {"role": "user", "content": "Please solve this issue: fix lib.py"}


def client_for(served: Served, sid: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=served.server.base_url(sid), api_key=key, max_retries=0, timeout=60)


def folded(written: Written) -> Trajectory:
    """The session's turns between a started and a finished event, folded as the stream worker does."""
    payloads = [
        TrajectoryStarted(attempt=0, group_size=1, limits=Limits(), scaffold="gateway"),
        *written.payloads,
    ]
    payloads.append(
        TrajectoryFinished(
            outcome=Outcome.UNRESOLVED,
            reward=0.0,
            turns=len(written.turns),
            generated_tokens=0,
            context_tokens=0,
            last_seq=len(payloads),
        )
    )
    events: list[Event] = [
        make_event(
            p, run_id="run", seq=i, time_ns=i, source="test", group_id="g", trajectory_id="t", task_id="k"
        )
        for i, p in enumerate(payloads)
    ]
    result = fold_trajectory(events)
    assert isinstance(result, Trajectory)
    return result


async def test_tool_calls_round_trip_without_rendering_history_again(chat: ChatFormat, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    renders: list[int] = []
    original = ChatFormat.render_ids
    monkeypatch.setattr(
        ChatFormat, "render_ids", lambda self, m, t=None: renders.append(len(m)) or original(self, m, t)
    )
    replies = ["I will look around.\n" + CALL, CALL.replace("ls -la", "cat lib.py"), "All done."]
    async with scripted(chat, ScriptedPolicy(chat, replies)) as served:
        session, written = served.open()
        messages: list[dict[str, object]] = [SYSTEM, TASK]
        async with client_for(served, session.sid, session.key) as client:
            for turn in range(3):
                answer = await client.chat.completions.create(model=MODEL, messages=messages, tools=[BASH])
                message = answer.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if turn < 2:
                    assert answer.choices[0].finish_reason == "tool_calls"
                    [call] = message.tool_calls or []
                    assert call.function.name == "bash" and json.loads(call.function.arguments)["command"]
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": f"output {turn}"})
                else:
                    assert answer.choices[0].finish_reason == "stop" and message.tool_calls is None
    assert renders == [2], "only the first call renders its history"
    turns = written.turns
    assert [t.drift for t in turns] == [None, None, None]
    prompt = list(turns[0].observation_token_ids)
    assert "<tools>" in chat.decode_exact(prompt) and '"name": "bash"' in chat.decode_exact(prompt)
    tool_message = {"role": "tool", "tool_call_id": messages[3]["tool_call_id"], "content": "output 0"}  # type: ignore[index]
    assert list(turns[1].observation_token_ids) == chat.continuation(
        turns[0].output_token_ids, [tool_message]
    )
    assert messages[2]["content"] == "I will look around." and messages[4].get("content") in (None, "")
    trajectory = folded(written)
    assert trajectory.prompt_tokens == len(prompt) and trajectory.history_drifts == 0
    outputs = [i for t in turns for i in t.output_token_ids]
    assert [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m] == outputs


async def test_streamed_tool_calls_hold_back_the_call_and_send_it_whole(chat: ChatFormat) -> None:
    async with scripted(chat, ScriptedPolicy(chat, ["Listing files.\n" + CALL])) as served:
        session, _ = served.open()
        async with client_for(served, session.sid, session.key) as client:
            stream = await client.chat.completions.create(
                model=MODEL, messages=[SYSTEM, TASK], tools=[BASH], stream=True
            )
            chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join(d.content or "" for d in deltas) == "Listing files."
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert len(calls) == 1 and json.loads(calls[0].function.arguments or "") == {"command": "ls -la"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert all("<tool" not in (d.content or "") for d in deltas)


async def test_a_malformed_tool_call_is_content_with_finish_stop_and_counted(chat: ChatFormat) -> None:
    bad = "<tool_call>\n{not json}\n</tool_call>"
    async with scripted(chat, ScriptedPolicy(chat, [bad])) as served:
        session, written = served.open()
        async with client_for(served, session.sid, session.key) as client:
            answer = await client.chat.completions.create(model=MODEL, messages=[TASK], tools=[BASH])
        assert served.gateway.metrics.tool_call_errors == 1
    choice = answer.choices[0]
    assert (
        choice.message.content == bad and choice.message.tool_calls is None and choice.finish_reason == "stop"
    )
    assert written.turns[0].tool_call_error is not None and "not JSON" in written.turns[0].tool_call_error


async def test_a_stop_string_cuts_the_answer_and_the_kept_tokens(chat: ChatFormat) -> None:
    reply = "alpha beta STOP gamma delta"
    for stream in (False, True):
        async with scripted(chat, ScriptedPolicy(chat, [reply, "next"])) as served:
            session, written = served.open()
            async with client_for(served, session.sid, session.key) as client:
                answer = await client.chat.completions.create(
                    model=MODEL, messages=[TASK], stop=["STOP"], stream=stream
                )
                if stream:
                    content = "".join([c.choices[0].delta.content or "" async for c in answer if c.choices])
                else:
                    content = answer.choices[0].message.content or ""
                assert content == "alpha beta "
                kept = list(written.turns[0].output_token_ids)
                assert "STOP" in chat.decode_exact(kept) and "STOP" not in chat.decode_exact(kept[:-1])
                assert "delta" not in chat.decode_exact(kept)
                again = [TASK, {"role": "assistant", "content": content}, {"role": "user", "content": "more"}]
                await client.chat.completions.create(model=MODEL, messages=again)
            assert written.turns[1].drift is None  # the cut answer came back as sent: an extension


async def test_a_changed_history_is_re_rendered_recorded_and_masked(chat: ChatFormat) -> None:
    async with scripted(chat, ScriptedPolicy(chat, ["one", "two", "three"])) as served:
        session, written = served.open()
        async with client_for(served, session.sid, session.key) as client:
            first = await client.chat.completions.create(model=MODEL, messages=[SYSTEM, TASK])
            answer = {"role": "assistant", "content": first.choices[0].message.content}
            edited = [
                SYSTEM,
                {"role": "user", "content": "Please solve this issue: fix lib.py now"},
                answer,
                {"role": "user", "content": "go on"},
            ]
            second = await client.chat.completions.create(model=MODEL, messages=edited)
            extended = [
                *edited,
                {"role": "assistant", "content": second.choices[0].message.content},
                {"role": "user", "content": "and?"},
            ]
            third = await client.chat.completions.create(
                model=MODEL, messages=extended, extra_body={"return_token_ids": True}
            )
        assert served.gateway.metrics.drifts == {"edited": 1}
    turns = written.turns
    drift = turns[1].drift
    assert drift is not None and drift.reason == "edited" and drift.message == 1 and drift.turn == 2
    assert turns[2].drift is None
    prompt = chat.render_ids([SYSTEM, TASK])
    assert 0 < drift.offset < len(prompt)  # the edit is inside the first user message
    trajectory = folded(written)
    assert trajectory.history_drifts == 1 and trajectory.turns == 3
    choice = third.choices[0]
    assert list(trajectory.token_ids) == choice.prompt_token_ids + choice.token_ids  # type: ignore[attr-defined]
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    assert trained == [*turns[1].output_token_ids, *turns[2].output_token_ids]  # turn 1's context is gone


async def test_a_retry_without_the_missed_answer_is_a_dropped_drift(chat: ChatFormat) -> None:
    async with scripted(chat, ScriptedPolicy(chat, ["one", "two"])) as served:
        session, written = served.open()
        async with client_for(served, session.sid, session.key) as client:
            await client.chat.completions.create(model=MODEL, messages=[SYSTEM, TASK])
            await client.chat.completions.create(
                model=MODEL, messages=[SYSTEM, TASK]
            )  # the answer was "lost"
    drift = written.turns[1].drift
    assert drift is not None and drift.reason == "dropped" and drift.message == 2
    assert drift.offset == len(chat.render_ids([SYSTEM, TASK]))  # the prompt stays; turn 1's output goes
    trajectory = folded(written)
    trained = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m]
    assert trained == list(written.turns[1].output_token_ids)


def test_tool_call_parsing_refuses_what_it_cannot_read() -> None:
    ok = parse_tool_calls("text\n" + CALL + "\n" + CALL, "seed")
    assert ok.content == "text" and len(ok.tool_calls) == 2 and ok.error is None
    assert ok.tool_calls[0].id != ok.tool_calls[1].id
    for bad, why in (
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', "name"),
        ('<tool_call>\n{"name": "bash", "arguments": [1]}\n</tool_call>', "JSON object"),
        ('<tool_call>\n{"name": "bash"', "no </tool_call>"),
    ):
        parsed = parse_tool_calls(bad, "seed")
        assert parsed.content == bad and parsed.tool_calls == () and why in (parsed.error or "")
