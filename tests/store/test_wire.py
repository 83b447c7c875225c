"""Wire validation (token arrays left packed) agrees with the reference decoder on every record."""

from __future__ import annotations

import json
from functools import cache

import pytest

from streams.eventgen import generate_events, sample_event
from streams.events import DecodeError, Event, decode_event, encode_event
from streams.store.wire import WIRE_PAYLOADS, decode_record, packed_count, packed_min


@cache
def _events() -> list[Event]:
    return generate_events(1000, seed=9)


def _first(kind: str) -> Event:
    return next(e for e in _events() if e.type == kind)


def _data(event_json: bytes) -> dict[str, object]:
    return json.loads(event_json)["data"]


def test_every_type_decodes_to_the_same_event_and_payload_json() -> None:
    events = _events() + [sample_event(kind, 3) for kind in WIRE_PAYLOADS]
    for event in events:
        raw = encode_event(event)
        wire, data_json = decode_record(raw)
        assert (wire.id, wire.type, wire.seq, wire.time_ns) == (
            event.id,
            event.type,
            event.seq,
            event.time_ns,
        )
        assert json.loads(data_json) == _data(raw) == event.data.model_dump(mode="json")
        assert decode_event(raw) == event


def test_packed_arrays_are_counted_without_unpacking() -> None:
    turn = _first("turn.generated")
    wire, _ = decode_record(encode_event(turn))
    assert packed_count(wire.data.output_token_ids, 4) == len(turn.data.output_token_ids)  # type: ignore[attr-defined]
    assert packed_count(wire.data.output_logprobs, 8) == len(turn.data.output_logprobs)  # type: ignore[attr-defined]
    assert packed_min(wire.data.output_versions, "i") == min(turn.data.output_versions)  # type: ignore[attr-defined]
    assert packed_count("", 4) == 0 and packed_min("", "i") is None


def test_list_arrays_are_validated_and_stored_packed() -> None:
    turn = _first("turn.generated")
    raw = json.loads(encode_event(turn))
    raw["data"]["output_token_ids"] = turn.data.output_token_ids.tolist()  # type: ignore[attr-defined]
    _, data_json = decode_record(json.dumps(raw).encode())
    assert json.loads(data_json) == turn.data.model_dump(mode="json")  # packed, as the encoder writes it
    raw["data"]["output_token_ids"] = [1, "two", 3]
    with pytest.raises(DecodeError, match="output_token_ids"):
        decode_record(json.dumps(raw).encode())


@pytest.mark.parametrize(
    "mutate",
    [
        lambda r: r["data"].__setitem__("output_token_ids", "not base64!"),
        lambda r: r["data"].__setitem__("output_token_ids", "AAA="),  # 2 bytes: not whole int32 items
        lambda r: r["data"].__setitem__("output_token_ids", [1.0]),  # a float is not an int32 item
        lambda r: r["data"].__setitem__("output_logprobs", ["-0.5"]),  # a string is not a float64 item
        lambda r: r["data"].__setitem__("turn", 0),  # violates ge=1
        lambda r: r["data"].pop("engine_id"),
        lambda r: r.__setitem__("extra", 1),
        lambda r: r.__setitem__("type", "no.such.type"),
        lambda r: r.__setitem__("schema_version", 99),
    ],
)
def test_bad_records_fail_exactly_when_the_reference_decoder_fails(mutate: object) -> None:
    turn = _first("turn.generated")
    raw = json.loads(encode_event(turn))
    mutate(raw)  # type: ignore[operator]
    value = json.dumps(raw).encode()
    with pytest.raises(DecodeError) as reference:
        decode_event(value)
    with pytest.raises(DecodeError) as ours:
        decode_record(value)
    assert ours.value.reason == reference.value.reason
    with pytest.raises(DecodeError):
        decode_record(b"{not json")


def test_payload_text_is_cut_from_the_record_only_when_it_is_the_last_top_level_object() -> None:
    event = _first("tool.executed")
    raw = json.loads(encode_event(event))
    reordered = json.dumps({"data": raw["data"], **{k: v for k, v in raw.items() if k != "data"}}).encode()
    spaced = json.dumps(raw, indent=2).encode()
    for value in (encode_event(event), reordered, spaced, encode_event(event) + b"\n"):
        _, data_json = decode_record(value)
        assert json.loads(data_json) == raw["data"]
