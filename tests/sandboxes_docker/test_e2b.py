"""The e2b backend without E2B's cloud (unreachable here): the key only from the
environment and never in a message, settings mapped onto the SDK call, the SDK's
real result and exception types mapped to ExecResult and typed sandbox errors, a
start against an unresolvable API domain failing as an infrastructure error, and a
timed-out command followed by `kill -9 -1` as the command user (the calls a
stand-in for E2B's cloud, `CloudStandIn`, receives in place of the VM's envd)."""

from __future__ import annotations

import asyncio
import logging
import traceback
from typing import Any

import httpx
import pytest
from e2b import (
    AuthenticationException,
    CommandExitException,
    CommandResult,
    RateLimitException,
    SandboxException,
    SandboxNotFoundException,
    SandboxNotRunningException,
    TimeoutException,
)

from sandboxes import e2b as e2b_backend
from sandboxes.base import (
    BackendUnavailableError,
    SandboxLostError,
    SandboxStartError,
    SandboxTimeoutError,
)
from sandboxes.e2b import KILL_ALL_COMMAND, E2BSandboxFactory, create_options, map_error, to_exec_result
from sandboxes.output import OutputCollector
from sandboxes.settings import E2BSettings, SandboxSettings

KEY_ENV = "ROLLSTREAM_TEST_E2B_KEY"
SECRET = "e2b_0123456789abcdef_rollstream_test_secret"


def settings(**e2b: object) -> SandboxSettings:
    return SandboxSettings.model_validate({"backend": "e2b", "e2b": {"api_key_env": KEY_ENV, **e2b}})


def test_missing_key_says_which_variable_to_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(BackendUnavailableError) as error:
        E2BSandboxFactory(settings())
    assert KEY_ENV in str(error.value) and error.value.kind == "sandbox_start"
    monkeypatch.setenv(KEY_ENV, "   ")
    with pytest.raises(BackendUnavailableError):
        E2BSandboxFactory(settings())


def test_settings_map_onto_the_sdk_call() -> None:
    e2b = settings(template="swe-py311", timeout_s=900, request_timeout_s=12.5, domain="e2b.example").e2b
    options = create_options(e2b, sandbox_id="abc", run_id="run-1")
    assert options == {
        "template": "swe-py311",
        "timeout": 900,
        "metadata": {"rollstream.sandbox": "abc", "rollstream.run": "run-1"},
        "allow_internet_access": False,
        "request_timeout": 12.5,
        "domain": "e2b.example",
    }
    assert "api_key" not in create_options(E2BSettings(), sandbox_id="x", run_id="")
    assert "domain" not in create_options(E2BSettings(), sandbox_id="x", run_id="")


async def test_failed_start_is_typed_and_never_shows_the_key(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(KEY_ENV, SECRET)
    factory = E2BSandboxFactory(settings(domain="e2b.invalid", request_timeout_s=20), run_id="r")
    box = factory.create(None)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(SandboxStartError) as raised:  # the API's domain does not resolve
        await box.start()
    error = raised.value
    shown = [
        str(error),
        repr(error),
        repr(box),
        repr(factory),
        caplog.text,
        "".join(traceback.format_exception(error)),
    ]
    assert all(SECRET not in text for text in shown)
    assert isinstance(error, BackendUnavailableError) and "cannot reach E2B" in str(error)
    with pytest.raises(SandboxLostError):
        await box.exec("true")
    await box.stop()


def test_rejected_key_is_redacted_and_unavailable() -> None:
    e2b = settings().e2b
    rejected = AuthenticationException(f"401: invalid API key {SECRET}")
    mapped = map_error(rejected, stage="start", settings=e2b, secret=SECRET)
    assert isinstance(mapped, BackendUnavailableError)
    assert SECRET not in str(mapped) and "[redacted]" in str(mapped) and KEY_ENV in str(mapped)


@pytest.mark.parametrize(
    ("error", "stage", "expected"),
    [
        (SandboxNotRunningException("sandbox was not found"), "exec", SandboxLostError),
        (SandboxNotFoundException("no such sandbox"), "files", SandboxLostError),
        (TimeoutException("deadline_exceeded"), "exec", SandboxTimeoutError),
        (RateLimitException("429"), "exec", SandboxTimeoutError),
        (SandboxException("envd failed"), "exec", SandboxLostError),
        (RateLimitException("429"), "start", SandboxStartError),
        (TimeoutException("template build pending"), "start", SandboxStartError),
        (httpx.ConnectError("dns failure"), "start", BackendUnavailableError),
    ],
)
def test_sdk_errors_map_to_typed_sandbox_errors(error: Exception, stage: str, expected: type) -> None:
    mapped = map_error(error, stage=stage, settings=E2BSettings(), secret=SECRET)  # type: ignore[arg-type]
    assert type(mapped) is expected
    assert type(error).__name__ in str(mapped)


def test_command_results_map_to_exec_results() -> None:
    ok = to_exec_result(
        CommandResult(stderr="", stdout="out\n", exit_code=0, error=None), OutputCollector(1000), 0.5, 60
    )
    assert (ok.exit_code, ok.stdout, ok.ok, ok.output_bytes) == (0, "out\n", True, 4)

    failed = CommandExitException(stderr="boom\n", stdout="", exit_code=2, error=None)
    result = to_exec_result(failed, OutputCollector(1000), 0.5, 60)
    assert (result.exit_code, result.stderr, result.timed_out) == (2, "boom\n", False)

    killed = CommandExitException(stderr=None, stdout=None, exit_code=-1, error="signal: killed")
    timed = to_exec_result(killed, OutputCollector(1000), 61.0, 60)
    assert timed.exit_code == 137 and timed.timed_out and timed.killed_reason == "timeout"

    streamed = OutputCollector(400)
    streamed.add(1, b"x" * 10_000)
    big = to_exec_result(CommandResult(stderr=None, stdout=None, exit_code=0, error=None), streamed, 1.0, 60)
    assert big.output_truncated and big.output_bytes == 10_000 and len(big.stdout) < 400


class CloudStandIn:
    """What `AsyncSandbox.create` returns, standing in for E2B's cloud (unreachable here): it
    records each command and its user, and answers with the SDK's own result types. A command
    holding `sleep` runs into its `timeout -s KILL` limit and is reported killed (exit -1), as
    envd reports it; any other command exits 0 at once."""

    def __init__(self, kill_fails: bool = False) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.kill_fails = kill_fails
        self.commands = self
        self.files = self

    async def run(self, cmd: str, *, user: str | None = None, timeout: float | None = None, **_: Any) -> Any:
        self.calls.append((cmd, user))
        if cmd == KILL_ALL_COMMAND and self.kill_fails:
            raise SandboxNotRunningException("sandbox was killed")
        if "sleep" in cmd:
            limit = float(cmd.split()[3])  # timeout -s KILL <limit> sh -c ...
            await asyncio.sleep(limit)
            raise CommandExitException(stderr="", stdout="", exit_code=-1, error="signal: killed")
        return CommandResult(stderr="", stdout="", exit_code=0, error=None)

    async def write(self, path: str, data: bytes, *, user: str | None = None, **_: Any) -> None:
        self.calls.append((f"write {path}", user))

    async def kill(self) -> None:
        self.calls.append(("kill sandbox", None))


async def started_box(monkeypatch: pytest.MonkeyPatch, cloud: CloudStandIn, **e2b: object) -> Any:
    monkeypatch.setenv(KEY_ENV, SECRET)

    async def create(**_: Any) -> CloudStandIn:
        return cloud

    monkeypatch.setattr(e2b_backend.AsyncSandbox, "create", create)
    box = E2BSandboxFactory(settings(**e2b), run_id="r").create(None)
    await box.start()
    cloud.calls.clear()  # the workspace upload
    return box


async def test_a_timed_out_command_kills_every_process_of_its_user(monkeypatch: pytest.MonkeyPatch) -> None:
    cloud = CloudStandIn()
    box = await started_box(monkeypatch, cloud, user="agent")
    timed = await box.exec("setsid sleep 600 &\n sleep 600", timeout=0.2)
    assert timed.timed_out and timed.exit_code == 137 and timed.killed_reason == "timeout"
    assert [user for _, user in cloud.calls] == ["agent", "agent"]
    assert cloud.calls[0][0].startswith("timeout -s KILL 0.200 sh -c")
    assert cloud.calls[1][0] == KILL_ALL_COMMAND == "kill -9 -1 2>/dev/null; true"

    cloud.calls.clear()
    done = await box.exec("true")
    assert done.ok and [cmd for cmd, _ in cloud.calls] == ["timeout -s KILL 180.000 sh -c true"]
    await box.stop()


async def test_a_sandbox_failing_to_clean_up_after_a_timeout_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    box = await started_box(monkeypatch, CloudStandIn(kill_fails=True))
    with pytest.raises(SandboxLostError) as raised:
        await box.exec("sleep 600", timeout=0.2)
    assert "SandboxNotRunningException" in str(raised.value)
    await box.stop()


def test_the_command_user_cannot_be_root() -> None:
    assert settings().e2b.user == "user"
    for user in ("root", " root ", ""):
        with pytest.raises(ValueError, match="unprivileged user"):
            settings(user=user)
