"""The gateway's pure parts: an OpenAI request checked and normalised, and how a request's history
relates to what its session has seen (extend, or which rewrite)."""

from __future__ import annotations

import random

import pytest

from agents.gateway.errors import OpenAIError
from agents.gateway.history import Extend, Rewrite, Seen, plan
from agents.gateway.requests import normalise_messages, parse_chat_request

USER = {"role": "user", "content": "hi"}


def request(**body: object) -> dict[str, object]:
    return {"model": "m", "messages": [USER], **body}


def refused(**body: object) -> OpenAIError:
    with pytest.raises(OpenAIError) as error:
        parse_chat_request(request(**body), "m")
    assert error.value.status == 400
    return error.value


def test_what_is_not_implemented_is_a_400_naming_it() -> None:
    assert refused(n=3).param == "n"
    assert refused(presence_penalty=0.2).param == "presence_penalty"
    assert refused(logit_bias={"5": 1}).param == "logit_bias"
    assert refused(response_format={"type": "json_object"}).param == "response_format"
    assert refused(parallel_tool_calls=False).param == "parallel_tool_calls"
    assert refused(stream_options={"include_usage": True, "x": 1}).param == "stream_options"
    assert refused(top_logprobs=3).param == "top_logprobs"  # without logprobs: true
    assert refused(top_logprobs=21, logprobs=True).param == "top_logprobs"
    assert refused(stop=["a", "b", "c", "d", "e"]).param == "stop"
    assert refused(max_tokens=5, max_completion_tokens=6).param == "max_tokens"
    assert refused(temperature=2.5).param == "temperature"
    assert "Unrecognized request argument supplied: best_of" in refused(best_of=2).message
    assert refused(messages=[]).param == "messages"


def test_defaults_labels_and_extensions_are_accepted() -> None:
    asked = parse_chat_request(
        request(n=1, user="me", metadata={"a": "b"}, store=False, stop="END", top_k=5, ignore_eos=True), "m"
    )
    assert asked.stop == ("END",) and asked.top_k == 5 and asked.ignore_eos and not asked.stream
    assert asked.max_tokens is None and asked.tools is None and not asked.parse_tools
    tools = [{"type": "function", "function": {"name": "bash"}}]
    assert parse_chat_request(request(tools=tools), "m").parse_tools
    assert not parse_chat_request(request(tools=tools, tool_choice="none"), "m").parse_tools
    with pytest.raises(OpenAIError) as unknown:
        parse_chat_request(request(), "other")
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"


def test_messages_are_normalised_for_comparison() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}, "extra": 1}
    raw = [
        {
            "role": "developer",
            "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}],
        },
        {"role": "assistant", "content": None, "refusal": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "out"},
    ]
    assert normalise_messages(raw) == [
        {"role": "system", "content": "be brief"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}],
        },
        {"role": "tool", "content": "out", "tool_call_id": "c1"},
    ]
    with pytest.raises(OpenAIError, match="without a tool_call_id"):
        normalise_messages([{"role": "tool", "content": "x"}])
    # Messages are checked when a session first sees them (history), so an image is refused there.
    with pytest.raises(OpenAIError) as image:
        normalise_messages([USER, {"role": "user", "content": [{"type": "image_url"}]}])
    assert image.value.status == 400 and image.value.param == "messages[1].content"


def m(role: str, text: str) -> dict[str, object]:
    return {"role": role, "content": text}


SEEN = [m("system", "s"), m("user", "u1"), m("assistant", "a1"), m("user", "u2"), m("assistant", "a2")]


@pytest.mark.parametrize(
    ("messages", "tools", "expected"),
    [
        ([*SEEN, m("user", "u3")], None, Extend([m("user", "u3")])),
        ([m("system", "s"), m("user", "u1 edited"), *SEEN[2:], m("user", "u3")], None, Rewrite(1, "edited")),
        ([SEEN[0], *SEEN[2:], m("user", "u3")], None, Rewrite(1, "dropped")),
        ([SEEN[0], m("user", "new"), *SEEN[1:], m("user", "u3")], None, Rewrite(1, "inserted")),
        (SEEN[:4], None, Rewrite(4, "dropped")),  # a retry without the answer it missed
        ([*SEEN, m("user", "u3")], [{"type": "function"}], Rewrite(0, "tools")),
    ],
)
def test_plan_extends_or_says_where_and_why_it_rewrites(
    messages: list[dict[str, object]], tools: list[dict[str, object]] | None, expected: Extend | Rewrite
) -> None:
    assert plan(SEEN, None, messages, tools) == expected


def test_the_fast_path_agrees_with_normalising_everything() -> None:
    rng = random.Random(4)
    for _ in range(200):
        seen = Seen.nothing()
        history = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
        for turn in range(6):
            found, whole = seen.plan(list(history), None)
            slow = plan(seen.messages, seen.tools, normalise_messages(history), None)
            assert found == slow, (turn, history)
            added = found.added if isinstance(found, Extend) else None
            answer = {"role": "assistant", "content": f"a{turn}"}
            seen.update(list(history), None, added, whole, answer)
            history = [*history, dict(answer), {"role": "user", "content": f"u{turn}"}]
            if rng.random() < 0.3:  # a client that edits, drops or re-keys a message
                index = rng.randrange(len(history) - 1)
                change = rng.choice(["edit", "drop", "rekey"])
                if change == "edit":
                    history[index] = {**history[index], "content": "changed"}
                elif change == "drop":
                    del history[index]
                else:  # same message, other key order and a null field: not a change
                    history[index] = {
                        "content": history[index]["content"],
                        "role": history[index]["role"],
                        "name": None,
                    }
