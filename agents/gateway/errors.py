"""Errors of the gateway as OpenAI writes them: a status and `{"error": {message, type, param, code}}`.

The status decides what an OpenAI client does: it retries 408, 409, 429 and 5xx, and raises
the rest at once, so a session that has ended answers 403 and its agent stops instead of
retrying for minutes. litellm (1.110) maps 400 `context_length_exceeded` to
ContextWindowExceededError, 401 to AuthenticationError and 404 to NotFoundError, but an
OpenAI-compatible 403 to a plain APIError, which mini-swe-agent retries
(`agent.mini.model_retries`, 2 attempts: one more 403 after its 4 s wait) before it stops.
"""

from __future__ import annotations

from typing import Any


class OpenAIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code
        self.param = param

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, "invalid_request_error", code, param)


def not_implemented(param: str, what: str) -> OpenAIError:
    """A parameter the gateway does not implement: refused, never accepted and ignored."""
    return bad_request(f"{what} is not supported by this gateway", param, "unsupported_parameter")


def context_exceeded(message: str) -> OpenAIError:
    return bad_request(message, "messages", "context_length_exceeded")


def session_ended(reason: str) -> OpenAIError:
    return OpenAIError(403, f"this session has ended ({reason}): open a new one", "permission_error", reason)


def engine_unavailable(message: str) -> OpenAIError:
    return OpenAIError(503, f"the engine failed: {message}", "server_error", "engine_error")
