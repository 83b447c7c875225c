"""Why the embedded engine did not answer a request with tokens (`agents.engine.engine.Engine`).

The server maps them to HTTP: a refusal is a 400 (the context cap's a
`context_length_exceeded` one; a full queue a 503), a failed scheduler step a 500, a
stopping engine a 503 "engine_stopping". A client retries the 5xx ones.
"""

from __future__ import annotations


class EngineRefusal(ValueError):
    """A request the engine will not run; the message says why and what to do."""


class ContextLengthError(EngineRefusal):
    pass


class QueueFullError(EngineRefusal):
    pass


class EngineFailure(RuntimeError):
    """A scheduler step failed (a bug, out of memory): the requests in it fail with this error,
    queued requests stay queued and the engine keeps serving."""


class EngineStopping(RuntimeError):
    """The engine is stopping: a request it had not finished, or one sent meanwhile, was not run to
    its end. Not an abort the client asked for: the server answers 503, which a client retries (on
    another engine, or on this one once restarted)."""


def check_input(input_ids: list[int], context_length: int, vocab_size: int) -> None:
    """Refuse input the engine cannot run: empty, at or over the context cap, or ids outside the
    vocabulary (raises `EngineRefusal` / `ContextLengthError`, saying what to do)."""
    if not input_ids:
        raise EngineRefusal("input_ids is empty: send at least one token")
    if len(input_ids) >= context_length:
        raise ContextLengthError(
            f"The input ({len(input_ids)} tokens) is at or over the model's context length "
            f"({context_length} tokens): shorten the context or raise engine.context_length"
        )
    if min(input_ids) < 0 or max(input_ids) >= vocab_size:
        raise EngineRefusal(f"input_ids must be token ids in [0, {vocab_size})")
