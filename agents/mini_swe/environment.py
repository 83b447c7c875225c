"""mini-swe-agent's environment over our `Sandbox`: its commands run in our sandboxes.

mini-swe-agent's `execute` is synchronous (its agent loop runs in a worker thread); the sandbox
is asynchronous and lives on the worker's event loop, so each command is handed to that loop
and the thread waits for it. The command runs as `<agent.shell> -c <command> 2>&1` (mini
merges stderr into stdout) in the task's workspace, with mini's environment variables, under
our limits: the command timeout (`sandbox.limits.command_timeout_s`), clipped to the agent's
time left, and the sandbox's own caps. A sandbox failure raises out of the agent as the
`SandboxError` it is (an infrastructure outcome), never as a command result.

Each command is written as `tool.executed` (its raw output, head and tail past
`limits.tool_output_chars`: the text the model saw is in the next turn's observation ids).
Its submit convention is kept as its own local environment has it: a command whose output's
first line is `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`, exiting 0, submits (mini's `Submitted`).
Once the session has ended (a limit, the deadline) no command runs: `SessionEnded` stops it.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from pydantic import BaseModel

from agents.scaffold import truncate_output
from sandboxes.base import ExecResult, Sandbox
from streams.payloads import Payload, ToolExecuted

SUBMIT_SENTINEL = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SessionEnded(RuntimeError):
    """The agent's session ended (its outcome is the session's): no more commands."""


class SandboxEnvironmentConfig(BaseModel):
    env: dict[str, str] = {}
    shell: str = "bash"
    timeout: float = 60.0
    tool_output_chars: int = 10000


class SandboxEnvironment:
    """mini-swe-agent's Environment protocol (config, execute, get_template_vars, serialize)."""

    def __init__(
        self,
        box: Sandbox,
        loop: asyncio.AbstractEventLoop,
        config: SandboxEnvironmentConfig,
        *,
        emit: Callable[[Payload], Awaitable[None]],
        turn: Callable[[], int],
        stopped: Callable[[], str | None],
        time_left: Callable[[], float],
        system: dict[str, str],
    ) -> None:
        self.box = box
        self.loop = loop
        self.config = config
        self._emit = emit
        self._turn = turn
        self._stopped = stopped
        self._time_left = time_left
        self.system = system
        self.tool_s = 0.0

    def _on_loop(self, work: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result()

    def execute(self, action: dict[str, Any], cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        reason = self._stopped()
        if reason is not None:
            raise SessionEnded(f"the session has ended ({reason}): the command was not run")
        from minisweagent.exceptions import Submitted

        command = str(action.get("command", ""))
        limit = max(min(float(timeout or self.config.timeout), self._time_left()), 1.0)
        started = time.monotonic()
        result: ExecResult = self._on_loop(self._exec(command, cwd, limit))
        self.tool_s += time.monotonic() - started
        text = result.stdout + result.stderr
        output: dict[str, Any] = {"output": text, "returncode": result.exit_code, "exception_info": ""}
        if result.timed_out:
            output.update(returncode=-1, exception_info=f"The command timed out after {limit:.0f} seconds")
        self._on_loop(self._record(command, result, text))
        lines = text.lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_SENTINEL and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )
        return output

    async def _exec(self, command: str, cwd: str, limit: float) -> ExecResult:
        shell = f"{self.config.shell} -c {shlex.quote(command)} 2>&1"
        return await self.box.exec(shell, timeout=limit, cwd=cwd or None, env=self.config.env or None)

    async def _record(self, command: str, result: ExecResult, text: str) -> None:
        shown = truncate_output(text, self.config.tool_output_chars)
        await self._emit(
            ToolExecuted(
                turn=max(self._turn(), 1),
                command=command,
                exit_code=result.exit_code,
                output=shown.text,
                output_bytes=max(result.output_bytes, len(text.encode())),
                truncated=shown.truncated or result.output_truncated,
                duration_s=max(result.duration_s, 0.0),
                timed_out=result.timed_out,
            )
        )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return {**self.config.model_dump(), **self.system, **kwargs}

    def serialize(self) -> dict[str, Any]:
        config = self.config.model_dump(mode="json")
        return {
            "info": {"config": {"environment": config, "environment_type": "rollstream.SandboxEnvironment"}}
        }


async def sandbox_system(box: Sandbox) -> dict[str, str]:
    """The sandbox's `uname` fields, as mini's local environment reads them from `platform.uname()`."""
    result = await box.exec("uname -s; uname -n; uname -r; uname -v; uname -m", timeout=30.0)
    fields = (result.stdout.splitlines() + [""] * 5)[:5]
    return dict(zip(("system", "node", "release", "version", "machine"), fields, strict=True))
