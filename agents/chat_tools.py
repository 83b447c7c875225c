"""Tool calls in a chat model's text: the Hermes / Qwen `<tool_call>` convention. Pure functions.

A model calls a tool by writing, after any text of its own,

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls"}}
    </tool_call>

once per call (Hermes-2-Pro and Qwen2.5/Qwen3 are trained on it; their templates render
OpenAI `tools` and `tool_calls` this way). `parse_tool_calls` reads an output back into an
OpenAI assistant message: `content` is the text before the first `<tool_call>`, each block
a call whose `arguments` is the JSON string OpenAI clients expect. A block that does not
parse (bad JSON, no name, arguments that are not an object, no closing tag) makes the whole
output plain content, with the reason in `error`: it is counted, never guessed at.

For templates that do not render tools themselves (SmolLM2's, our ChatML default),
`tools_prompt` writes the tools into the system message in the same convention, and
`tool_calls_text` writes an assistant message's calls into its content; the model's own
template renders everything else (tool results keep their role).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

TOOLS_PROMPT = """\
# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text (OpenAI's `function.arguments`)

    def openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ParsedReply:
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    error: str | None = None  # why a <tool_call> block could not be read (then content is the whole text)


def call_id(seed: str, index: int) -> str:
    """A tool call id, deterministic in (seed, index): a re-run of a turn names its calls the same."""
    return "call_" + hashlib.sha256(f"{seed}|{index}".encode()).hexdigest()[:24]


def parse_tool_calls(text: str, id_seed: str) -> ParsedReply:
    """`text` (a model's reply, stop token removed) as content and tool calls; see the module docstring."""
    start = text.find(OPEN)
    if start < 0:
        return ParsedReply(text)
    calls: list[ToolCall] = []
    rest = text[start:]
    while rest.strip():
        if not rest.lstrip().startswith(OPEN):
            break  # text after the last call: ignored, as vLLM's Hermes parser does
        rest = rest.lstrip()[len(OPEN) :]
        end = rest.find(CLOSE)
        if end < 0:
            return ParsedReply(text, error=f"a {OPEN} block has no {CLOSE}")
        call, problem = _one_call(rest[:end], call_id(id_seed, len(calls)))
        if call is None:
            return ParsedReply(text, error=problem)
        calls.append(call)
        rest = rest[end + len(CLOSE) :]
    return ParsedReply(text[:start].rstrip(), tuple(calls))


def _one_call(body: str, identifier: str) -> tuple[ToolCall | None, str]:
    try:
        value = json.loads(body)
    except ValueError as error:
        return None, f"a tool call is not JSON: {error}"
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None, 'a tool call needs a "name" (a non-empty string)'
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None, f"the arguments of {value['name']} are not a JSON object"
    if not isinstance(arguments, dict):
        return None, f"the arguments of {value['name']} are not a JSON object"
    return ToolCall(identifier, value["name"], json.dumps(arguments, ensure_ascii=False)), ""


def tools_prompt(tools: Sequence[dict[str, Any]]) -> str:
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools))


def tool_calls_text(content: str, calls: Sequence[dict[str, Any]]) -> str:
    """An assistant message's content with its OpenAI `tool_calls` written in the convention."""
    parts = [content] if content else []
    for call in calls:
        function = call.get("function", call)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        parts.append(f"{OPEN}\n{body}\n{CLOSE}")
    return "\n".join(parts)
