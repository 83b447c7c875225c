"""A policy that replies from a fixed script (tests): each call returns the next reply,
tokenised with the episode's chat format, ending with the turn-end token (`<|im_end|>`).

Replies are per trajectory (keyed by the trajectory part of `rid`), so one
`ScriptedPolicy` can serve concurrent episodes. After the script runs out the
last reply repeats. Logprobs are 0.0 and the weight version is `weight_version`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agents.chat import ChatFormat
from agents.engine.protocol import EngineError, Generation, SamplingParams


class ScriptedPolicy:
    def __init__(
        self, chat: ChatFormat, replies: Sequence[str], *, weight_version: int = 0, delay_s: float = 0.0
    ) -> None:
        if not replies:
            raise ValueError("a ScriptedPolicy needs at least one reply")
        self.chat = chat
        self.replies = list(replies)
        self.weight_version = weight_version
        self.delay_s = delay_s
        self.calls: dict[str, int] = {}
        self.aborted: list[str] = []

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        trajectory = rid.rsplit(":", 1)[0]
        index = self.calls.get(trajectory, 0)
        self.calls[trajectory] = index + 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if not input_ids:
            raise EngineError("request", "empty input_ids")
        text = self.replies[min(index, len(self.replies) - 1)]
        return reply_generation(
            self.chat,
            text,
            params,
            prompt_tokens=len(input_ids),
            weight_version=self.weight_version,
            engine_id="scripted",
            latency_s=self.delay_s,
        )

    async def abort(self, rid: str) -> None:
        self.aborted.append(rid)


def reply_generation(
    chat: ChatFormat,
    text: str,
    params: SamplingParams,
    *,
    prompt_tokens: int,
    weight_version: int,
    engine_id: str,
    latency_s: float = 0.0,
) -> Generation:
    """`text` as an engine's output: ids ending with the turn-end token, cut at `max_new_tokens`
    (finish `length`), logprobs 0.0, every token of `weight_version`."""
    ids = [*chat.encode(text), *chat.turn_end]
    finish = "stop"
    if len(ids) > params.max_new_tokens:
        ids, finish = ids[: params.max_new_tokens], "length"
    return Generation(
        output_ids=tuple(ids),
        output_logprobs=tuple(0.0 for _ in ids),
        output_versions=tuple(weight_version for _ in ids),
        finish_reason=finish,  # type: ignore[arg-type]
        weight_version=weight_version,
        engine_id=engine_id,
        prompt_tokens=prompt_tokens,
        queue_wait_s=0.0,
        latency_s=latency_s,
    )
