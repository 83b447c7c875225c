"""Events validated as they are on the wire, token arrays left packed: what the SQL store keeps.

The sink must validate every record (a record that is not a valid event goes to
`deadletter`), but it never needs the token arrays as Python lists: `events.data`
keeps them packed (base64, `streams.packed`) and the projections need only their
lengths and a minimum. So each payload model gets a wire twin (`WIRE_PAYLOADS`)
whose packed-array fields are the base64 text, checked (valid base64, whole items)
but not unpacked; JSON lists (hand-written records) are validated by the field's
own `PackedArray`, as the model would, and packed. Everything else — every other
field, constraint and nested model — is the payload model's own. Validation runs
in pydantic-core straight from the record's bytes.

Records under an older schema version, and records that fail here, go through
`streams.events.decode_event`, so upcasting and the error message are the
reference behaviour; `decode_record` raises `DecodeError` exactly when it does.
`wire_from_row` reads a stored `events` row back through the same validation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
)

from streams.events import CURRENT_VERSIONS, ENVELOPE_FIELD_DEFS, PAYLOADS, Event, decode_event, encode_event
from streams.packed import PackedArray, pack, packed_array_of, packed_bytes


def _packed_type(packed: PackedArray) -> Any:
    """Base64 text of `packed`'s items; a JSON list is validated as `packed` does and packed."""

    def pack_list(value: Any) -> Any:
        if not isinstance(value, list):
            return value
        return pack(packed.validate(value), packed.typecode)

    def check(value: str) -> str:
        packed_bytes(value, packed.typecode)  # raises ValueError unless base64 of whole items
        return value

    return Annotated[str, BeforeValidator(pack_list), AfterValidator(check)]


def _wire_payload(model: type[BaseModel]) -> type[BaseModel]:
    overrides: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        packed = packed_array_of(info.metadata)
        if packed is not None:
            default = "" if info.default_factory is not None else ...
            overrides[name] = (
                _packed_type(packed),
                Field(default=default, description=info.description),
            )
    if not overrides:
        return model
    return create_model("Wire" + model.__name__, __base__=model, **overrides)  # type: ignore[call-overload, no-any-return]


WIRE_PAYLOADS: dict[str, type[BaseModel]] = {kind: _wire_payload(model) for kind, model in PAYLOADS.items()}


class WireEvent(BaseModel):
    """An event as validated on the wire: `Event`'s envelope, `data` a wire payload (arrays packed)."""

    model_config = Event.model_config
    id: Any
    type: str
    schema_version: int
    run_id: str
    group_id: str | None
    trajectory_id: str | None
    task_id: str | None
    seq: int
    policy_version: int | None
    time_ns: int
    source: str
    causation_id: Any
    data: Any


def _envelope(kind: str, payload: type[BaseModel]) -> type[WireEvent]:
    return create_model(  # type: ignore[call-overload, no-any-return]
        "Wire_" + kind.replace(".", "_"),
        __base__=WireEvent,
        type=(Literal[kind], ...),
        data=(payload, ...),
        **ENVELOPE_FIELD_DEFS,
    )


_ANY_WIRE_EVENT: TypeAdapter[Any] = TypeAdapter(
    Annotated[
        Union[tuple(_envelope(kind, payload) for kind, payload in WIRE_PAYLOADS.items())],  # noqa: UP007
        Field(discriminator="type"),
    ]
)
_HAS_PACKED_ARRAYS = frozenset(kind for kind, wire in WIRE_PAYLOADS.items() if wire is not PAYLOADS[kind])
_DATA_KEY = b',"data":{'  # only the envelope's `data` holds an object, so this is the top-level key


def decode_record(value: bytes) -> tuple[WireEvent, str]:
    """A record as a `WireEvent` and its payload's JSON text (`DecodeError` as `decode_event`)."""
    try:
        event: WireEvent = _ANY_WIRE_EVENT.validate_json(value)
    except ValidationError:
        event = to_wire(decode_event(value))  # names the error, or upcasts an older version
        return event, event.data.model_dump_json()
    if event.schema_version != CURRENT_VERSIONS[event.type]:
        event = to_wire(decode_event(value))
        return event, event.data.model_dump_json()
    return event, _data_text(value, event)


def _data_text(value: bytes, event: WireEvent) -> str:
    """The payload's JSON text, cut from the record when that is safe, else serialised again.

    Safe: one `"data":` key, followed by an object, and it is the last top-level value
    (the record ends in `}}`: every other envelope field is a scalar). Payloads with
    packed arrays must contain no `[` (a hand-written list form is stored packed)."""
    start = value.find(_DATA_KEY)
    end = len(value.rstrip())
    if start >= 0 and value.endswith(b"}}", 0, end) and value.count(b'"data":') == 1:
        text = value[start + len(_DATA_KEY) - 1 : end - 1]
        if event.type not in _HAS_PACKED_ARRAYS or b"[" not in text:
            return text.decode()
    return str(event.data.model_dump_json())


def wire_from_row(row: Mapping[str, Any]) -> WireEvent:
    """The `WireEvent` an `events` row holds (`data` decoded JSON or its text), validated as on the wire."""
    data = row["data"]
    record = {name: row[name] for name in Event.ENVELOPE_FIELDS} | {
        "data": json.loads(data) if isinstance(data, str) else data
    }
    event, _ = decode_record(json.dumps(record).encode())
    return event


def to_wire(event: Event) -> WireEvent:
    """The `WireEvent` of a typed event (tests and upcast records)."""
    wire: WireEvent = _ANY_WIRE_EVENT.validate_json(encode_event(event))
    return wire


def packed_count(value: str, itemsize: int) -> int:
    """Items in a packed array without decoding it (base64 length minus padding)."""
    padding = value.count("=", max(len(value) - 2, 0))
    return (len(value) * 3 // 4 - padding) // itemsize


def packed_min(value: str, typecode: str) -> Any:
    """The smallest item of a packed array, None when empty (numpy: a quarter of `min` over an array)."""
    items = np.frombuffer(packed_bytes(value, typecode), dtype=np.dtype(typecode).newbyteorder("<"))
    return items.min().item() if items.size else None
