"""A faster `decode_event` with the same results: one pydantic-core pass from bytes.

`streams.events.decode_event` parses JSON into Python objects and validates twice
(payload, then envelope). Here each current event type gets an envelope model
whose `type` is a literal and whose `data` is that type's payload; the record's
type, read from the bytes, picks the model, which validates straight from the JSON
bytes in Rust. The result is built
as a plain `Event` (equal to what `decode_event` returns). Anything the fast path
does not accept — older schema versions that need upcasting, unknown types, bad
JSON, schema violations — goes through `decode_event`, so errors and upcasting
are exactly the reference behaviour.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from streams.events import PAYLOADS, Event, decode_event

_ENVELOPE_FIELDS: dict[str, Any] = {
    "id": (uuid.UUID, ...),
    "schema_version": (int, Field(ge=1)),
    "run_id": (str, ...),
    "group_id": (str | None, None),
    "trajectory_id": (str | None, None),
    "task_id": (str | None, None),
    "seq": (int, Field(ge=0)),
    "policy_version": (int, Field(default=0, ge=0)),
    "time_ns": (int, Field(ge=0)),
    "source": (str, ...),
    "causation_id": (uuid.UUID | None, None),
}


def _envelope(kind: str, payload: type[BaseModel]) -> type[BaseModel]:
    """The envelope of one type; fields in `Event`'s order, so its `__dict__` can become an Event's."""
    own = {"type": (Literal[kind], ...), "data": (payload, ...)}
    fields = {name: own.get(name) or _ENVELOPE_FIELDS[name] for name in Event.model_fields}
    return create_model(  # type: ignore[call-overload, no-any-return]
        "Envelope_" + kind.replace(".", "_"), __config__=ConfigDict(frozen=True, extra="forbid"), **fields
    )


_ENVELOPE_OF: dict[bytes, type[BaseModel]] = {
    kind.encode(): _envelope(kind, payload) for kind, payload in PAYLOADS.items()
}
TYPE_FIELD = b'"type":"'
_CURRENT = {kind: payload.SCHEMA_VERSION for kind, payload in PAYLOADS.items()}


def decode_event_fast(value: bytes | str) -> Event:
    """Same contract as `streams.events.decode_event` (raises `DecodeError`)."""
    raw = value.encode() if isinstance(value, str) else value
    envelope_model = _ENVELOPE_OF.get(_type_name(raw))
    if envelope_model is None:
        return decode_event(value)  # unknown type, or not our compact JSON: the reference path
    try:
        envelope = envelope_model.model_validate_json(raw)
    except ValidationError:
        return decode_event(value)  # the reference path names the error (or upcasts)
    if envelope.schema_version != _CURRENT[envelope.type]:
        return decode_event(value)
    return _as_event(envelope)


def _type_name(raw: bytes) -> bytes:
    """The value of the first `"type":"..."` in the record: the envelope's type in what
    `encode_event` writes. A wrong guess is harmless: the envelope's `type` is a literal,
    so the record then fails validation and takes the reference path."""
    start = raw.find(TYPE_FIELD)
    if start < 0:
        return b""
    start += len(TYPE_FIELD)
    return raw[start : raw.find(b'"', start)]


def _as_event(envelope: BaseModel) -> Event:
    """The validated envelope's fields as an `Event`, without validating them again
    (what `Event.model_construct` does, minus its per-field Python loop)."""
    event = Event.__new__(Event)
    object.__setattr__(event, "__dict__", envelope.__dict__)  # the envelope is not used again
    object.__setattr__(event, "__pydantic_fields_set__", envelope.__pydantic_fields_set__)
    object.__setattr__(event, "__pydantic_extra__", None)
    object.__setattr__(event, "__pydantic_private__", None)
    return event
