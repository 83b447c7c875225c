"""The policy an episode samples from: anything with `generate` and `abort`.

`agents.engine.client.EngineClient` satisfies it (HTTP to our engine or SGLang);
`ScriptedPolicy` (tests) and `SimulatedPolicy` (benchmarks) do too. `rid` names
the request so a deadline can abort it while it runs.
"""

from __future__ import annotations

from typing import Protocol

from agents.engine.protocol import Generation, SamplingParams


class Policy(Protocol):
    async def generate(self, input_ids: list[int], params: SamplingParams, rid: str) -> Generation: ...

    async def abort(self, rid: str) -> None: ...
