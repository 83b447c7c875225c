"""A simulated engine for benchmarks: replies on a schedule, with a latency per call.

`SimulatedPolicy` satisfies `agents.policy.Policy` without a model. A `TurnScript`
(given the trajectory id and the turn number) says how long the call takes
(unscaled seconds) and whether the reply submits; replies are a fixed bash
command or the submit command, tokenised once. Sleeps are multiplied by
`time_scale`. `abort(rid)` ends the in-flight call with finish reason `abort`.
`on_work` is told the unscaled seconds of every call as it begins.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from agents.chat import ChatFormat
from agents.engine.protocol import Generation, SamplingParams

COMMAND_REPLY = "THOUGHT: inspect the repository.\n\n```bash\nls -la && git status\n```"
SUBMIT_REPLY = "THOUGHT: the fix is in place.\n\n```bash\n{submit_command}\n```"


@dataclass(frozen=True)
class SimulatedTurn:
    latency_s: float
    submits: bool


TurnScript = Callable[[str, int], SimulatedTurn]


def never_submits(latency_s: float) -> TurnScript:
    """A script for agents that keep working until a cap stops them."""
    return lambda trajectory, turn: SimulatedTurn(latency_s, False)


class SimulatedPolicy:
    def __init__(
        self,
        chat: ChatFormat,
        script: TurnScript,
        *,
        submit_command: str,
        time_scale: float = 1.0,
        weight_version: int = 0,
        on_work: Callable[[float], None] | None = None,
    ) -> None:
        self.chat = chat
        self.script = script
        self.time_scale = time_scale
        self.weight_version = weight_version
        self.on_work = on_work
        self._command_ids = [*chat.encode(COMMAND_REPLY), *chat.turn_end]
        self._submit_ids = [*chat.encode(SUBMIT_REPLY.format(submit_command=submit_command)), *chat.turn_end]
        self._in_flight: dict[str, asyncio.Future[None]] = {}
        self.calls = 0

    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation:
        trajectory, _, turn = rid.rpartition(":")
        planned = self.script(trajectory, int(turn))
        self.calls += 1
        if self.on_work is not None:
            self.on_work(planned.latency_s)
        aborted = asyncio.get_running_loop().create_future()
        self._in_flight[rid] = aborted
        try:
            await asyncio.wait_for(asyncio.shield(aborted), planned.latency_s * self.time_scale)
            finish = "abort"
        except TimeoutError:
            finish = "stop"
        finally:
            self._in_flight.pop(rid, None)
        ids = self._submit_ids if planned.submits else self._command_ids
        if finish == "abort":
            ids = []
        elif len(ids) > params.max_new_tokens:
            ids, finish = ids[: params.max_new_tokens], "length"
        return Generation(
            output_ids=tuple(ids),
            output_logprobs=(-0.5,) * len(ids),
            output_versions=(self.weight_version,) * len(ids),
            finish_reason=finish,  # type: ignore[arg-type]
            weight_version=self.weight_version,
            engine_id="simulated",
            prompt_tokens=len(input_ids),
            queue_wait_s=0.0,
            latency_s=planned.latency_s,
        )

    async def abort(self, rid: str) -> None:
        future = self._in_flight.get(rid)
        if future is not None and not future.done():
            future.set_result(None)
