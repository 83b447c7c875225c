"""The bash agent scaffold (in the spirit of mini-swe-agent): templates and reply handling.

Pure functions only; the episode (`agents.episode`) does the I/O.

- Every model reply must contain exactly one fenced bash block (```bash ... ```).
  Anything else is a format error whose message is fed back as the next user
  turn; `AgentSettings.max_format_errors` in a row end the episode.
- The agent submits by making the last line of its command the submit command
  (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`); lines before it still run.
- Command output is shown to the model as head + tail when longer than the
  limit, with the number of elided characters in between.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SYSTEM_TEMPLATE = """\
You are a software engineer working in a bash shell on a repository with an open issue.
Each reply must contain a short THOUGHT and exactly ONE fenced bash block:

```bash
your command here
```

Each command runs in a fresh shell in the repository directory; a `cd` lasts for that
command only, so chain commands with && where needed. There is no interactive input (no vim, no less).
When the issue is fixed, reply with exactly this command as the last line of the block:

```bash
{submit_command}
```"""

INSTANCE_TEMPLATE = """\
<issue>
{instruction}
</issue>

Fix the issue by editing the source files (leave the tests as they are). Start by exploring the repository."""

FORMAT_ERROR_TEMPLATE = """\
Format error: {problem}. Reply with a short THOUGHT and exactly ONE fenced bash block:

```bash
your command here
```"""

OBSERVATION_TEMPLATE = """\
<returncode>{exit_code}</returncode>
<output>
{output}</output>"""

TIMEOUT_NOTE = "The command timed out after {timeout:.0f} seconds and was killed."

# the closing fence must start a line, so a ``` inside a heredoc or patch line does not end the block
_BASH_BLOCK = re.compile(r"```bash[ \t]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True)
class Action:
    """A parsed reply: the command to run, and whether the agent submits after it."""

    command: str
    submits: bool


@dataclass(frozen=True)
class FormatError:
    """A reply without exactly one bash block; `message` is what the model is shown."""

    problem: str

    @property
    def message(self) -> str:
        return FORMAT_ERROR_TEMPLATE.format(problem=self.problem)


@dataclass(frozen=True)
class ShownOutput:
    text: str  # as shown to the model
    truncated: bool
    elided_chars: int


def system_prompt(submit_command: str) -> str:
    return SYSTEM_TEMPLATE.format(submit_command=submit_command)


def instance_prompt(instruction: str) -> str:
    return INSTANCE_TEMPLATE.format(instruction=instruction.strip())


def parse_reply(text: str, submit_command: str) -> Action | FormatError:
    """The reply's one bash block as an `Action`, or why it is not usable."""
    blocks = _BASH_BLOCK.findall(text)
    if not blocks:
        return FormatError("no ```bash block found in your reply")
    if len(blocks) > 1:
        return FormatError(f"found {len(blocks)} ```bash blocks, expected exactly one")
    command = blocks[0].strip()
    if not command:
        return FormatError("the ```bash block is empty")
    return split_submit(command, submit_command)


def split_submit(command: str, submit_command: str) -> Action:
    """`Action` for `command`: submits when its last non-empty line is the submit command."""
    lines = command.rstrip().splitlines()
    if lines and lines[-1].strip() == submit_command.strip():
        return Action(command="\n".join(lines[:-1]).strip(), submits=True)
    return Action(command=command, submits=False)


def truncate_output(text: str, limit: int) -> ShownOutput:
    """`text` if at most `limit` characters, else its head and tail with the elided count."""
    if limit <= 0 or len(text) <= limit:
        return ShownOutput(text, truncated=False, elided_chars=0)
    head = limit // 2
    tail = limit - head
    elided = len(text) - limit
    shown = f"{text[:head]}\n[... {elided} characters elided ...]\n{text[len(text) - tail :]}"
    return ShownOutput(shown, truncated=True, elided_chars=elided)


def render_observation(
    exit_code: int | None, output: str, limit: int, timed_out: bool = False, timeout_s: float = 0.0
) -> ShownOutput:
    """The user message showing a command's result; `output` is stdout then stderr."""
    shown = truncate_output(output, limit)
    body = shown.text if not shown.text or shown.text.endswith("\n") else shown.text + "\n"
    if timed_out:
        body += TIMEOUT_NOTE.format(timeout=timeout_s) + "\n"
    code = "timeout" if timed_out else ("none" if exit_code is None else str(exit_code))
    text = OBSERVATION_TEMPLATE.format(exit_code=code, output=body)
    return ShownOutput(text, shown.truncated, shown.elided_chars)
