"""Token arrays: `array.array` in memory, base64 of little-endian items on the wire.

A `turn.generated` with 8,192 output tokens carries 8,192 ids and 8,192 logprobs.
As Python lists that is ~16K objects to build, free and walk for the garbage
collector on every decode; as JSON numbers ~200 KB of text. So the array fields of
the payloads (`TokenIds`, `LossMask`, `Logprobs`) hold an `array.array` (int32 ids
and versions, int8 loss masks, float64 logprobs): one buffer, encoded with a single
base64 pass, handed to numpy or torch without a copy (`np.frombuffer`).

Validation accepts the packed string (what the wire carries), a list or tuple of
numbers (what producers and records written before packing have), or an array;
every item must fit the item type. JSON Schema says "array of numbers, or base64
string", so records of either form validate against the committed schemas.
Note that an `array` never equals a `list`: compare with `list(...)` or `.tolist()`.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable
from typing import Annotated, Any, NamedTuple

import pybase64
from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

_LITTLE = sys.byteorder == "little"


class _Item(NamedTuple):
    name: str  # what the items are
    size: int  # bytes per item
    json_type: str  # JSON Schema type of an item in the list form


_ITEM = {
    "i": _Item("int32", 4, "integer"),
    "b": _Item("int8", 1, "integer"),
    "d": _Item("float64", 8, "number"),
}


class PackedArray:
    """Pydantic metadata of an array field: `typecode` items ('i', 'b' or 'd')."""

    def __init__(self, typecode: str, description: str) -> None:
        item = _ITEM[typecode]
        if array(typecode).itemsize != item.size:
            raise AssertionError(f"array typecode {typecode!r} is not {item.name} on this platform")
        self.typecode = typecode
        self._description = description

    def validate(self, value: Any) -> array[Any]:
        """The array behind `value` (packed string, list, tuple or array); `ValueError` when not one."""
        if isinstance(value, str):
            return unpack(value, self.typecode)
        if isinstance(value, (list, tuple, array, range)):
            try:
                return array(self.typecode, value)
            except (TypeError, OverflowError) as error:
                raise ValueError(f"array items must be {_ITEM[self.typecode].name} values: {error}") from None
        raise ValueError(f"expected a list of numbers or a base64 string, got {type(value).__name__}")

    def serialize(self, value: Any) -> str:
        return pack(value, self.typecode)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            self.validate,
            serialization=core_schema.plain_serializer_function_ser_schema(
                self.serialize, return_schema=core_schema.str_schema(), when_used="json"
            ),
        )

    def __get_pydantic_json_schema__(self, core: CoreSchema, _: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {
            "anyOf": [
                {"type": "array", "items": {"type": _ITEM[self.typecode].json_type}},
                {"type": "string", "contentEncoding": "base64", "description": self._description},
            ]
        }


def pack(values: Any, typecode: str) -> str:
    """Base64 of `values` (an array, or a sequence of numbers) as little-endian `typecode` items."""
    items = values if isinstance(values, array) and values.typecode == typecode else array(typecode, values)
    if not _LITTLE:
        items = array(typecode, items)
        items.byteswap()
    return pybase64.b64encode(items).decode("ascii")


def unpack(value: str, typecode: str) -> array[Any]:
    """The array behind a packed string; `ValueError` when it is not base64 of whole items."""
    items = array(typecode, packed_bytes(value, typecode))
    if not _LITTLE:
        items.byteswap()
    return items


def packed_bytes(value: str, typecode: str) -> bytes:
    """The little-endian bytes of a packed string; `ValueError` when it is not base64 of whole items."""
    try:
        raw = pybase64.b64decode(value, validate=True)
    except ValueError as error:
        raise ValueError(f"packed array is not valid base64: {error}") from None
    size = _ITEM[typecode].size
    if len(raw) % size:
        raise ValueError(f"packed array has {len(raw)} bytes, not a multiple of {size}")
    return raw


def empty(typecode: str) -> Callable[[], array[Any]]:
    """A default factory: a new empty array of `typecode`."""
    return lambda: array(typecode)


TOKEN_IDS = PackedArray("i", "little-endian int32 token ids")
LOSS_MASK = PackedArray("b", "little-endian int8 loss mask (0 or 1)")
LOGPROBS = PackedArray("d", "little-endian float64 logprobs")

# `array` is not subscriptable before Python 3.12; the typecode says what the items are.
TokenIds = Annotated[array, TOKEN_IDS]
LossMask = Annotated[array, LOSS_MASK]
Logprobs = Annotated[array, LOGPROBS]


def packed_array_of(metadata: list[Any]) -> PackedArray | None:
    """The `PackedArray` among a field's metadata, if it is an array field."""
    return next((m for m in metadata if isinstance(m, PackedArray)), None)
