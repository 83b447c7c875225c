"""The e2b backend: one E2B cloud microVM (`e2b.AsyncSandbox`) per sandbox.

Contract:
- Template, lifetime, request timeout, domain and internet access come from
  `sandbox.e2b` (internet off by default). The API key comes only from the
  environment variable named by `sandbox.e2b.api_key_env`; it is read when needed,
  passed to the SDK and never stored on our objects, logged, or put in an error
  message (`redact`). No key → `BackendUnavailableError` naming the variable to set.
- Commands run as `sandbox.e2b.user` (never root) under `timeout -s KILL T sh -c CMD`
  (the process group dies at T); on a timeout every process of that user dies too
  (`kill -9 -1` run as it), `setsid` children included, as with the docker and bwrap
  backends: nothing the agent started keeps running into the verifier. E2B's envd
  runs as root and survives. Output streams through callbacks into the same head+tail
  keeper (`output_limit_bytes`), so nothing is buffered beyond the limit. The SDK
  raises `CommandExitException` for a non-zero exit: that is a result, not an error.
- SDK errors map to the sandbox layer's typed errors (`map_error`): a rejected key or
  an unreachable API → `BackendUnavailableError`; during start anything else →
  `SandboxStartError`; later, a sandbox that is gone → `SandboxLostError`, one that
  stops answering → `SandboxTimeoutError`.
- Files move as a tarball through E2B's file API, unpacked with `tar` inside.

E2B's cloud cannot be reached from the machines this project is tested on; the
tests cover everything above that does not need it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import httpx
from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    CommandResult,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    TimeoutException,
)

from sandboxes.base import (
    BackendUnavailableError,
    ExecResult,
    SandboxError,
    SandboxLostError,
    SandboxStartError,
    SandboxTimeoutError,
    Timings,
)
from sandboxes.output import SIGKILL_EXIT, STDERR, STDOUT, OutputCollector, exec_result, timeout_argv
from sandboxes.settings import E2BSettings, SandboxSettings
from sandboxes.transfer import extract_download, tar_directory, tar_path

BACKEND = "e2b"
# Run as the unprivileged command user: kill(-1) signals every process it may signal but itself.
KILL_ALL_COMMAND = "kill -9 -1 2>/dev/null; true"
Stage = Literal["start", "exec", "files"]


def read_api_key(settings: E2BSettings) -> str:
    """The key from the environment variable `settings.api_key_env`, or a clear error."""
    key = os.environ.get(settings.api_key_env, "").strip()
    if not key:
        raise BackendUnavailableError(
            f"the e2b backend needs an E2B API key: set the environment variable {settings.api_key_env} "
            "(its name is sandbox.e2b.api_key_env; keys are never read from config files)",
            backend=BACKEND,
        )
    return key


def redact(text: str, secret: str) -> str:
    return text.replace(secret, "[redacted]") if secret else text


def map_error(error: BaseException, *, stage: Stage, settings: E2BSettings, secret: str) -> SandboxError:
    """The typed sandbox error for an SDK error, its message free of the key."""
    detail = redact(f"{type(error).__name__}: {error}", secret)
    if isinstance(error, AuthenticationException):
        return BackendUnavailableError(
            f"E2B rejected the API key in ${settings.api_key_env} ({detail}); set a valid key",
            backend=BACKEND,
        )
    if isinstance(error, httpx.TransportError | OSError) and stage == "start":
        return BackendUnavailableError(
            f"cannot reach E2B's API ({detail}); E2B needs internet access to its cloud", backend=BACKEND
        )
    if stage == "start":
        return SandboxStartError(f"E2B sandbox did not start: {detail}", backend=BACKEND)
    if isinstance(error, SandboxError):
        return error
    if isinstance(error, SandboxNotRunningException | SandboxNotFoundException):
        return SandboxLostError(f"E2B sandbox is gone: {detail}", backend=BACKEND)
    if isinstance(error, TimeoutException | RateLimitException):
        return SandboxTimeoutError(f"E2B sandbox did not answer in time: {detail}", backend=BACKEND)
    return SandboxLostError(f"E2B sandbox failed during {stage}: {detail}", backend=BACKEND)


def command_exit_code(result: CommandResult[Any]) -> int:
    """The exit code, with a process killed by a signal (E2B reports -1) read as SIGKILL's 137."""
    if result.exit_code == -1 or (result.error or "").startswith("signal: killed"):
        return SIGKILL_EXIT
    return int(result.exit_code)


def to_exec_result(
    result: CommandResult[Any], output: OutputCollector, duration_s: float, limit_s: float
) -> ExecResult:
    """An SDK command result (or `CommandExitException`) as our ExecResult.

    Output normally arrives through the streaming callbacks into `output`; when the SDK
    retained it on the result instead, it goes through the same limit here.
    """
    if result.stdout:
        output.add(STDOUT, result.stdout.encode())
    if result.stderr:
        output.add(STDERR, result.stderr.encode())
    return exec_result(command_exit_code(result), output, duration_s, limit_s)


def create_options(settings: E2BSettings, *, sandbox_id: str, run_id: str) -> dict[str, Any]:
    """`AsyncSandbox.create` keyword arguments from the settings (all but the key)."""
    options: dict[str, Any] = {
        "template": settings.template,
        "timeout": settings.timeout_s,
        "metadata": {"rollstream.sandbox": sandbox_id, "rollstream.run": run_id},
        "allow_internet_access": settings.allow_internet_access,
        "request_timeout": settings.request_timeout_s,
    }
    if settings.domain:
        options["domain"] = settings.domain
    return options


class E2BSandboxFactory:
    """Makes E2B sandboxes; refuses at once when no API key is set."""

    backend = BACKEND

    def __init__(self, settings: SandboxSettings, *, run_id: str = "") -> None:
        read_api_key(settings.e2b)
        self.settings = settings
        self.run_id = run_id

    def create(self, workspace: Path | None) -> E2BSandbox:
        return E2BSandbox(self.settings, workspace, self.run_id)

    def __repr__(self) -> str:
        return f"E2BSandboxFactory(template={self.settings.e2b.template!r}, run_id={self.run_id!r})"


class E2BSandbox:
    """One E2B microVM; `exec` runs `sh -c COMMAND` under `timeout -s KILL` in the workspace."""

    backend = BACKEND

    def __init__(self, settings: SandboxSettings, workspace: Path | None, run_id: str) -> None:
        self.id = uuid.uuid4().hex[:12]
        self.timings = Timings()
        self._e2b = settings.e2b
        self._limits = settings.limits
        self._workspace = workspace
        self._run_id = run_id
        self._sandbox: AsyncSandbox | None = None
        self._stopped = False

    def __repr__(self) -> str:
        started = self._sandbox is not None
        return f"E2BSandbox(id={self.id!r}, template={self._e2b.template!r}, started={started})"

    async def start(self) -> None:
        began = time.monotonic()
        key = read_api_key(self._e2b)
        try:
            self._sandbox = await AsyncSandbox.create(
                **create_options(self._e2b, sandbox_id=self.id, run_id=self._run_id), api_key=key
            )
            await self._put(tar_directory(self._workspace, self._e2b.workdir))
        except Exception as error:  # any failure here is an infrastructure failure to start
            await self._kill_quietly()
            raise map_error(error, stage="start", settings=self._e2b, secret=key) from None
        self.timings.start_s = time.monotonic() - began

    async def exec(
        self,
        command: str,
        timeout: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        sandbox = self._require_running()
        limit = timeout if timeout is not None else self._limits.command_timeout_s
        output = OutputCollector(self._limits.output_limit_bytes)
        began = time.monotonic()
        try:
            result: CommandResult[Any] = await sandbox.commands.run(
                shlex.join(timeout_argv(command, limit)),
                envs=env,
                user=self._e2b.user,
                cwd=cwd or self._e2b.workdir,
                timeout=limit + self._e2b.exec_grace_s,
                request_timeout=self._e2b.request_timeout_s,
                on_stdout=lambda text: output.add(STDOUT, text.encode()),
                on_stderr=lambda text: output.add(STDERR, text.encode()),
                retain_output=False,
            )
        except CommandExitException as exited:
            result = exited
        except Exception as error:  # the SDK's own and its transport's: all infrastructure
            raise self._mapped(error, "exec") from None
        duration = time.monotonic() - began
        self.timings.execs.append(duration)
        executed = to_exec_result(result, output, duration, limit)
        if executed.timed_out:
            await self._kill_all_processes(sandbox)
        return executed

    async def _kill_all_processes(self, sandbox: AsyncSandbox) -> None:
        """SIGKILL every process of the command user (what `timeout` missed: `setsid` children)."""
        try:
            await sandbox.commands.run(
                KILL_ALL_COMMAND,
                user=self._e2b.user,
                cwd="/",
                timeout=self._e2b.exec_grace_s,
                request_timeout=self._e2b.request_timeout_s,
            )
        except CommandExitException:
            pass  # `kill` found processes it may not signal: the rest are dead
        except Exception as error:  # a sandbox that cannot clean up cannot be trusted with the next command
            raise self._mapped(error, "exec") from None

    async def upload(self, local: Path, remote: str) -> None:
        self._require_running()
        if not local.exists():
            raise FileNotFoundError(f"upload source {local} does not exist")
        await self._put(await asyncio.to_thread(tar_path, local, self._absolute(remote).lstrip("/")))

    async def download(self, remote: str, local: Path) -> None:
        sandbox = self._require_running()
        target = Path(self._absolute(remote))
        archive = f"/tmp/rollstream-download-{uuid.uuid4().hex[:8]}.tar"
        packed = await self.exec(
            f"tar -cf {archive} -C {shlex.quote(str(target.parent))} {shlex.quote(target.name)}",
            timeout=self._e2b.request_timeout_s,
        )
        if packed.exit_code != 0:
            raise FileNotFoundError(f"{remote} cannot be read in sandbox {self.id}: {packed.stderr.strip()}")
        try:
            data = await sandbox.files.read(
                archive, format="bytes", user=self._e2b.user, request_timeout=self._e2b.request_timeout_s
            )
        except (SandboxException, httpx.HTTPError, OSError) as error:
            raise self._mapped(error, "files") from None
        with tempfile.TemporaryDirectory(prefix="rollstream-dl-") as scratch:
            tarball = Path(scratch) / "download.tar"
            tarball.write_bytes(bytes(data))
            await asyncio.to_thread(extract_download, tarball, local, Path(scratch) / "out")

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        await self._kill_quietly()

    async def _put(self, tar_bytes: bytes) -> None:
        """Write a tarball into the VM and unpack it at `/` (paths inside are absolute-less)."""
        sandbox = self._require_running()
        archive = f"/tmp/rollstream-upload-{uuid.uuid4().hex[:8]}.tar"
        try:
            await sandbox.files.write(
                archive, tar_bytes, user=self._e2b.user, request_timeout=self._e2b.request_timeout_s
            )
        except (SandboxException, httpx.HTTPError, OSError) as error:
            raise self._mapped(error, "files") from None
        unpacked = await self.exec(f"tar -xf {archive} -C / && rm -f {archive}", timeout=120)
        if unpacked.exit_code != 0:
            raise OSError(f"unpacking an upload in sandbox {self.id} failed: {unpacked.stderr.strip()}")

    def _absolute(self, remote: str) -> str:
        return remote if remote.startswith("/") else f"{self._e2b.workdir.rstrip('/')}/{remote}"

    def _require_running(self) -> AsyncSandbox:
        if self._stopped or self._sandbox is None:
            raise SandboxLostError(
                f"sandbox {self.id} is not running (never started or stopped)", backend=BACKEND
            )
        return self._sandbox

    def _mapped(self, error: BaseException, stage: Stage) -> SandboxError:
        secret = os.environ.get(self._e2b.api_key_env, "")
        return map_error(error, stage=stage, settings=self._e2b, secret=secret)

    async def _kill_quietly(self) -> None:
        if self._sandbox is None:
            return
        with contextlib.suppress(SandboxException, httpx.HTTPError, OSError):
            await self._sandbox.kill()
