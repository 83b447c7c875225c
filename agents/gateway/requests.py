"""An OpenAI chat-completions request, checked and normalised (pure).

Implemented: `model`, `messages` (system or developer, user, assistant with `tool_calls`,
tool with `tool_call_id`; text content, as a string or text parts), `temperature`, `top_p`,
`max_tokens` / `max_completion_tokens`, `stop` (up to 4 strings), `seed`, `n` = 1,
`logprobs` with `top_logprobs` (0-20), `tools` with `tool_choice` "auto" or "none",
`stream` with `stream_options.include_usage`; the vLLM/SGLang extensions `top_k`,
`ignore_eos` and `return_token_ids`; `user`, `metadata` and `store` false as labels.
Everything else is refused with a 400 that names it (a penalty, `n` > 1, a forced tool
choice, a JSON response format, images...), never accepted and ignored, as is any argument
OpenAI does not define.

Messages are normalised so that two requests can be compared message by message: content is
a string (None and text parts folded), tool calls are `{id, type, function: {name,
arguments}}` with arguments as JSON text, and only the keys that reach the model are kept.
A request keeps its messages as sent (`raw_messages`): a session checks and normalises only
those it has not seen in its previous request (`agents.gateway.history`), so a call's work
does not grow with the history's length.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agents.gateway.errors import OpenAIError, bad_request, not_implemented

Message = dict[str, Any]
ROLES = {"system", "developer", "user", "assistant", "tool"}
MAX_STOP = 4
MAX_TOP_LOGPROBS = 20
# Accepted only at these values (OpenAI's defaults): anything else changes the answer in a way
# the gateway does not implement.
DEFAULT_ONLY: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "parallel_tool_calls": (None, True),
    "store": (None, False),
    "reasoning_effort": (None,),
    "prediction": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "web_search_options": (None,),
    "functions": (None,),
    "function_call": (None,),
    "service_tier": (None, "auto", "default"),
}
LABELS = {"user", "metadata"}
IMPLEMENTED = {
    "model",
    "messages",
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "max_completion_tokens",
    "stop",
    "seed",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "return_token_ids",
    "ignore_eos",
    "response_format",
}


@dataclass(frozen=True)
class ChatRequest:
    model: str
    raw_messages: list[Any]  # as sent: checked and normalised by `normalise_messages` (see history)
    tools: list[Message] | None
    parse_tools: bool  # tools given and tool_choice is not "none"
    temperature: float | None
    top_p: float | None
    top_k: int | None
    max_tokens: int | None
    stop: tuple[str, ...]
    seed: int | None
    logprobs: bool
    top_logprobs: int
    stream: bool
    include_usage: bool
    return_token_ids: bool
    ignore_eos: bool


def parse_chat_request(body: Any, served_model: str) -> ChatRequest:
    """`body` checked against what is implemented (module docstring); OpenAIError says what is wrong."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    _refuse_unimplemented(body)
    model = body.get("model")
    if model != served_model:
        raise OpenAIError(
            404,
            f"The model {model!r} does not exist; this gateway serves {served_model!r}",
            code="model_not_found",
        )
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise not_implemented(
            "tool_choice", f"tool_choice {choice!r} (only auto and none: no constrained decoding)"
        )
    logprobs = _boolean(body, "logprobs")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not logprobs:
        raise bad_request("top_logprobs needs logprobs: true", "top_logprobs")
    options = body.get("stream_options")
    if options is not None and (not isinstance(options, dict) or set(options) - {"include_usage"}):
        raise not_implemented("stream_options", "stream_options other than include_usage")
    return ChatRequest(
        model=served_model,
        raw_messages=_message_list(body.get("messages")),
        tools=tools,
        parse_tools=bool(tools) and choice != "none",
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 1e-9, 1.0),
        top_k=_integer(body, "top_k", -1, None, default=None),
        max_tokens=_max_tokens(body),
        stop=_stop(body.get("stop")),
        seed=_integer(body, "seed", None, None, default=None),
        logprobs=logprobs,
        top_logprobs=top or 0,
        stream=_boolean(body, "stream"),
        include_usage=bool(options and options.get("include_usage")),
        return_token_ids=_boolean(body, "return_token_ids"),
        ignore_eos=_boolean(body, "ignore_eos"),
    )


def _refuse_unimplemented(body: dict[str, Any]) -> None:
    for key, value in body.items():
        if key in DEFAULT_ONLY:
            if value not in DEFAULT_ONLY[key]:
                raise not_implemented(key, f"{key}={value!r}")
        elif key not in IMPLEMENTED and key not in LABELS:
            raise bad_request(f"Unrecognized request argument supplied: {key}", key)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise not_implemented(
            "response_format", "a response_format other than text (no constrained decoding)"
        )


def _message_list(raw: Any) -> list[Any]:
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages must be a non-empty list", "messages")
    return raw


def normalise_messages(raw: list[Any], start: int = 0) -> list[Message]:
    """`raw[i]` checked and normalised (`start`: the index of `raw[0]` in the request, for errors)."""
    return [_message(item, start + index) for index, item in enumerate(raw)]


def _message(item: Any, index: int) -> Message:
    where = f"messages[{index}]"
    if not isinstance(item, dict) or item.get("role") not in ROLES:
        raise bad_request(f"{where} must be an object with a role in {sorted(ROLES)}", where)
    role = "system" if item["role"] == "developer" else item["role"]
    message: Message = {"role": role, "content": _text(item.get("content"), where)}
    if isinstance(item.get("name"), str):
        message["name"] = item["name"]
    if role == "assistant" and item.get("tool_calls"):
        message["tool_calls"] = [
            _tool_call(call, f"{where}.tool_calls[{i}]") for i, call in enumerate(item["tool_calls"])
        ]
    if role == "tool":
        if not isinstance(item.get("tool_call_id"), str):
            raise bad_request(f"{where} is a tool message without a tool_call_id", f"{where}.tool_call_id")
        message["tool_call_id"] = item["tool_call_id"]
    return message


def _text(content: Any, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(part.get("text", "")) for part in content)
    raise not_implemented(f"{where}.content", "content other than text")


def _tool_call(call: Any, where: str) -> Message:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise bad_request(f"{where} must be {{id, type: function, function: {{name, arguments}}}}", where)
    arguments = function.get("arguments", "")
    if not isinstance(arguments, str):
        raise bad_request(f"{where}.function.arguments must be a JSON string", where)
    return {
        "id": str(call.get("id", "")),
        "type": "function",
        "function": {"name": function["name"], "arguments": arguments},
    }


def _tools(raw: Any) -> list[Message] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise bad_request("tools must be a list", "tools")
    for index, tool in enumerate(raw):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type") != "function" or not function.get("name"):
            raise bad_request(f"tools[{index}] must be {{type: function, function: {{name, ...}}}}", "tools")
    return raw or None


def _stop(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    stops = [raw] if isinstance(raw, str) else raw
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and s for s in stops)
        or len(stops) > MAX_STOP
    ):
        raise bad_request(f"stop must be a non-empty string or a list of up to {MAX_STOP} of them", "stop")
    return tuple(stops)


def _max_tokens(body: dict[str, Any]) -> int | None:
    plain = _integer(body, "max_tokens", 1, None, default=None)
    completion = _integer(body, "max_completion_tokens", 1, None, default=None)
    if plain is not None and completion is not None and plain != completion:
        raise bad_request("max_tokens and max_completion_tokens differ: send one of them", "max_tokens")
    return completion if completion is not None else plain


def _boolean(body: dict[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise bad_request(f"{key} must be true or false", key)
    return bool(value)


def _number(body: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise bad_request(f"{key} must be a number in [{low:g}, {high:g}]", key)
    return float(value)


def _integer(
    body: dict[str, Any], key: str, low: int | None, high: int | None, default: int | None = 0
) -> Any:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"{key} must be an integer", key)
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad_request(f"{key} must be in [{low}, {high}]", key)
    return value
