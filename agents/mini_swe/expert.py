"""The learning family's scripted expert in mini-swe-agent's tool-calling form.

The same decisions as `agents.expert` (`expert_reply`, seeded per trajectory and turn), read
from a mini-swe-agent context and written as a mini-swe-agent model would: the expert's
thought, then its command as one `bash` tool call (the Hermes `<tool_call>` convention the
gateway parses). mini-swe-agent shows command results as JSON in tool messages
(`{"returncode": 1, "output": "..."}` in its default config); they are read back into the
`<returncode>`/`<output>` text the expert reads. Its resolved episodes are mini-format SFT data.
"""

from __future__ import annotations

import json
import random
import re

from agents.chat import ChatFormat
from agents.chat_tools import CLOSE, OPEN
from agents.engine.protocol import EngineError, Generation, SamplingParams
from agents.expert import expert_reply
from agents.scripted import reply_generation
from agents.settings import AgentSettings, ExpertSettings

OBSERVATION = re.compile(r'\{\s*"returncode":\s*(-?\d+),\s*"output":\s*("(?:[^"\\]|\\.)*")', re.DOTALL)
BASH_BLOCK = re.compile(r"```bash\n(.*?)\n```", re.DOTALL)


def readable(context: str) -> str:
    """`context` with each JSON observation also written out as the expert's scaffold shows it."""
    shown = [
        f"<returncode>{code}</returncode>\n<output>\n{json.loads(output)}</output>"
        for code, output in OBSERVATION.findall(context)
    ]
    return "\n".join([context, *shown])


def as_tool_call(reply: str) -> str:
    """An expert reply (thought + one ```bash block) as thought + one bash tool call."""
    block = BASH_BLOCK.search(reply)
    if block is None:
        return reply
    thought = reply[: block.start()].rstrip()
    call = json.dumps({"name": "bash", "arguments": {"command": block.group(1)}})
    return f"{thought}\n{OPEN}\n{call}\n{CLOSE}"


class MiniExpertPolicy:
    """`expert_reply` for mini-swe-agent behind the `Policy` protocol; logprobs 0.0."""

    def __init__(
        self, chat: ChatFormat, settings: ExpertSettings, agent: AgentSettings, *, weight_version: int = 0
    ) -> None:
        self.chat = chat
        self.settings = settings
        self.submit_command = agent.submit_command
        self.weight_version = weight_version

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        if not input_ids:
            raise EngineError("request", "empty input_ids")
        rng = random.Random(f"{self.settings.seed}|{rid}")
        context = readable(self.chat.decode(input_ids))
        text = as_tool_call(expert_reply(context, rng, self.settings, self.submit_command))
        return reply_generation(
            self.chat,
            text,
            params,
            prompt_tokens=len(input_ids),
            weight_version=self.weight_version,
            engine_id="mini-expert",
        )

    async def abort(self, rid: str) -> None:
        return None
