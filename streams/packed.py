"""Token arrays packed for the wire.

A `turn.generated` with 8,192 output tokens carries 8,192 ids and 8,192 logprobs;
as JSON numbers that is ~200 KB and most of the encode/decode time. On the wire
these arrays are base64 of little-endian fixed-width values (int32 ids, int8 loss
masks, float64 logprobs); in Python they are plain lists. Readers still accept
JSON lists, so events written before packing (and hand-written test records) load.
"""

from __future__ import annotations

import sys
from array import array
from typing import Annotated, Any

import pybase64
from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

_LITTLE = sys.byteorder == "little"


def pack(values: list[int] | list[float], typecode: str) -> str:
    """Base64 of `values` as little-endian `typecode` items ('i', 'b' or 'd')."""
    arr = array(typecode, values)
    if not _LITTLE:
        arr.byteswap()
    return pybase64.b64encode(arr.tobytes()).decode("ascii")


def unpack(value: Any, typecode: str) -> Any:
    """The list behind a packed string; lists and anything else pass through to validation."""
    if not isinstance(value, str):
        return value
    try:
        raw = pybase64.b64decode(value, validate=True)
    except ValueError as error:
        raise ValueError(f"packed array is not valid base64: {error}") from None
    arr = array(typecode)
    if len(raw) % arr.itemsize:
        raise ValueError(f"packed array has {len(raw)} bytes, not a multiple of {arr.itemsize}")
    arr.frombytes(raw)
    if not _LITTLE:
        arr.byteswap()
    return arr.tolist()


def _schema(item: str, description: str) -> dict[str, Any]:
    return {
        "anyOf": [
            {"type": "array", "items": {"type": item}},
            {"type": "string", "contentEncoding": "base64", "description": description},
        ]
    }


TokenIds = Annotated[
    list[int],
    BeforeValidator(lambda v: unpack(v, "i")),
    PlainSerializer(lambda v: pack(v, "i"), return_type=str, when_used="json"),
    WithJsonSchema(_schema("integer", "little-endian int32 token ids")),
]
LossMask = Annotated[
    list[int],
    BeforeValidator(lambda v: unpack(v, "b")),
    PlainSerializer(lambda v: pack(v, "b"), return_type=str, when_used="json"),
    WithJsonSchema(_schema("integer", "little-endian int8 loss mask (0 or 1)")),
]
Logprobs = Annotated[
    list[float],
    BeforeValidator(lambda v: unpack(v, "d")),
    PlainSerializer(lambda v: pack(v, "d"), return_type=str, when_used="json"),
    WithJsonSchema(_schema("number", "little-endian float64 logprobs")),
]
