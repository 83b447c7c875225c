"""The scripted expert of the learning task family: an imperfect agent whose traces seed SFT.

It acts as a `Policy` (so its episodes run through the real rollout worker, sandboxes
and verifier, and land in the log like any other), reading its context the way a
model would: the decoded token ids. Its habits, as settings (`ExpertSettings`):

- on its first turn it runs the tests (`python3 run_tests.py`) with probability
  `test_first_rate`; otherwise it guesses a fix blind (a kind at random) and submits;
- after reading the test output it picks the fix whose telltale the shown line of
  `lib.py` carries with probability `right_edit_rate`, else another kind, and submits
  in the same command: it never re-checks.

So the resolved traces that `replay --dataset sft` keeps mix "read the tests, then
fix" with lucky blind guesses, as public traces of other agents do. Decisions are
seeded by (seed, trajectory id, turn): a re-run of an episode decides the same way.
"""

from __future__ import annotations

import random
import re

from agents.chat import ChatFormat
from agents.engine.protocol import EngineError, Generation, SamplingParams
from agents.scripted import reply_generation
from agents.settings import AgentSettings, ExpertSettings
from sandboxes.tasks.family import KINDS, RUN_TESTS, BugKind, kind_of_line

REASONS = {
    "off_by_one": "the result is one too big",
    "comparison": "the bound should be inclusive",
    "negation": "the condition is inverted",
    "min_max": "it should take the larger value",
}
RUN_REPLY = f"THOUGHT: run the tests to see what fails.\n\n```bash\n{RUN_TESTS}\n```"
SHOWN_LINE = re.compile(r"^\s*lib\.py:\d+: (.*)$", re.MULTILINE)


def fix_reply(kind: BugKind, submit_command: str) -> str:
    return f"THOUGHT: {REASONS[kind.name]}.\n\n```bash\n{kind.fix_command}\n{submit_command}\n```"


def expert_reply(context: str, rng: random.Random, settings: ExpertSettings, submit: str) -> str:
    """The expert's reply given the decoded context so far (pure, given `rng`)."""
    if "<returncode>" not in context:  # no command has run yet: the first turn
        if rng.random() < settings.test_first_rate:
            return RUN_REPLY
        return fix_reply(rng.choice(KINDS), submit)
    shown = SHOWN_LINE.findall(context)
    seen = kind_of_line(shown[-1]) if shown else None
    if seen is None:
        return f"THOUGHT: nothing left to fix.\n\n```bash\n{submit}\n```"
    if rng.random() < settings.right_edit_rate:
        return fix_reply(seen, submit)
    return fix_reply(rng.choice([k for k in KINDS if k is not seen]), submit)


class ExpertPolicy:
    """`expert_reply` behind the `Policy` protocol; logprobs 0.0, weight version `weight_version`."""

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
        rng = random.Random(f"{self.settings.seed}|{rid}")  # rid: trajectory id and turn
        text = expert_reply(self.chat.decode(input_ids), rng, self.settings, self.submit_command)
        return reply_generation(
            self.chat,
            text,
            params,
            prompt_tokens=len(input_ids),
            weight_version=self.weight_version,
            engine_id="expert",
        )

    async def abort(self, rid: str) -> None:
        return None
