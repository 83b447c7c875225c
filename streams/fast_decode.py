"""Faster `decode_event` and `encode_event` with exactly the reference results.

`streams.events.decode_event` parses JSON into Python objects and validates twice
(payload, then envelope). Here each current event type gets an envelope model
whose `type` is a literal and whose `data` is that type's payload; the record's
type, read from the bytes, picks the model, which validates straight from the
JSON bytes in Rust. Packed token arrays (`streams.packed`) are read with array.tolist
and not re-validated item by item. The result is rebuilt as a plain `Event` with
the plain payload class, equal to what `decode_event` returns. Anything the fast
path does not accept (older schema versions that need upcasting, unknown types,
arrays written as JSON lists, bad JSON, schema violations) goes through
`decode_event`, so errors and upcasting are exactly the reference behaviour.

`encode_event_fast` writes the same bytes as `encode_event` (tests compare them),
packing arrays with struct instead of array.
"""

from __future__ import annotations

import struct
import sys
import uuid
from array import array
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar, get_args

import pybase64
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    create_model,
)
from pydantic.fields import FieldInfo

from streams.events import PAYLOADS, Event, decode_event, encode_event
from streams.packed import Logprobs, LossMask, TokenIds
from streams.payloads import Payload

M = TypeVar("M", bound=BaseModel)
_LITTLE = sys.byteorder == "little"
STRUCT_CACHE_SIZE = 4096  # compiled pack formats kept per array type

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


_PACKED_TYPECODES = {id(get_args(alias)[1]): code for alias, code in ((TokenIds, "i"), (LossMask, "b"),
                                                                        (Logprobs, "d"))}  # fmt: skip


def _packed_typecode(info: FieldInfo) -> str | None:
    """'i', 'b' or 'd' when the field is one of `streams.packed`'s array types."""
    return next((_PACKED_TYPECODES[id(m)] for m in info.metadata if id(m) in _PACKED_TYPECODES), None)


def _unpacker(typecode: str) -> Callable[[Any], list[Any]]:
    """`streams.packed.unpack` for the packed (base64) form only, straight from the bytes (one
    copy, then tolist) and no per-item re-validation: the items are ints/floats by construction.
    JSON lists (older records) are refused here and take the reference path."""
    size = struct.calcsize("<" + typecode)
    if array(typecode).itemsize != size:
        raise AssertionError(f"array typecode {typecode!r} is not {size} bytes on this platform")

    def unpack_packed(value: Any) -> list[Any]:
        if not isinstance(value, str):
            raise ValueError("not a packed array")
        raw = pybase64.b64decode(value, validate=True)
        if len(raw) % size:
            raise ValueError("packed array length is not a multiple of its item size")
        items = array(typecode, raw)  # one copy, then tolist: no intermediate tuple (struct.unpack)
        if not _LITTLE:
            items.byteswap()
        return items.tolist()

    return unpack_packed


def _packer(typecode: str) -> Callable[[list[Any]], str]:
    """`streams.packed.pack` with a compiled struct per length: the same bytes (little-endian),
    faster than building an array from the list."""

    formats: dict[int, struct.Struct] = {}  # by item count; a run's arrays have few distinct lengths

    def pack_array(values: list[Any]) -> str:
        count = len(values)
        packer = formats.get(count)
        if packer is None:
            if len(formats) >= STRUCT_CACHE_SIZE:
                formats.clear()
            packer = formats[count] = struct.Struct(f"<{count}{typecode}")
        return pybase64.b64encode(packer.pack(*values)).decode("ascii")

    return pack_array


def _wire_payload(payload: type[Payload]) -> type[Payload]:
    """`payload` with its packed arrays read by `_unpacker` (the payload itself when it has none)."""
    overrides: dict[str, Any] = {}
    for name, info in payload.model_fields.items():
        code = _packed_typecode(info)
        if code is not None:
            default = info.get_default(call_default_factory=False) if not info.is_required() else ...
            field = Field(default_factory=info.default_factory) if info.default_factory else Field(default)
            read_write = (PlainValidator(_unpacker(code)), PlainSerializer(_packer(code), when_used="json"))
            overrides[name] = (Annotated[info.annotation, *read_write], field)
    if not overrides:
        return payload
    wire = create_model(payload.__name__ + "Wire", __base__=payload, **overrides)  # type: ignore[call-overload]
    if list(wire.model_fields) != list(payload.model_fields):
        raise AssertionError(f"{payload.__name__}: wire model reorders fields")
    _PAYLOAD_OF[wire] = payload
    _WIRE_OF[payload] = wire
    return wire  # type: ignore[no-any-return]


_PAYLOAD_OF: dict[type[BaseModel], type[Payload]] = {}
_WIRE_OF: dict[type[Payload], type[Payload]] = {}


def _envelope(kind: str, payload: type[Payload]) -> type[BaseModel]:
    """The envelope of one type; fields in `Event`'s order, so its `__dict__` can become an Event's."""
    own = {"type": (Literal[kind], ...), "data": (_wire_payload(payload), ...)}
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


def encode_event_fast(event: Event) -> bytes:
    """Same bytes as `streams.events.encode_event`, with packed arrays written by struct."""
    kind = event.type.encode()
    envelope_model = _ENVELOPE_OF.get(kind)
    if envelope_model is None or type(event.data) is not PAYLOADS[event.type]:
        return encode_event(event)  # a hand-built event: the reference path
    values = dict(event.__dict__)
    wire = _WIRE_OF.get(type(event.data))
    if wire is not None:
        values["data"] = _rebuilt(wire, event.data)
    envelope = _rebuilt(envelope_model, event, values)
    return envelope.__pydantic_serializer__.to_json(envelope)


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
    values = envelope.__dict__  # the envelope is not used again
    payload = _PAYLOAD_OF.get(type(values["data"]))
    if payload is not None:
        values["data"] = _rebuilt(payload, values["data"])
    return _rebuilt(Event, envelope, values)


def _rebuilt(cls: type[M], source: BaseModel, values: dict[str, Any] | None = None) -> M:
    """An instance of `cls` holding `source`'s validated values (same field order)."""
    instance = cls.__new__(cls)
    object.__setattr__(instance, "__dict__", source.__dict__ if values is None else values)
    object.__setattr__(instance, "__pydantic_fields_set__", source.__pydantic_fields_set__)
    object.__setattr__(instance, "__pydantic_extra__", None)
    object.__setattr__(instance, "__pydantic_private__", None)
    return instance
