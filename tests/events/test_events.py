"""The event contract: deterministic ids, packed arrays, upcasting, clear decode errors."""

from __future__ import annotations

import json
from array import array

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from streams import events as ev
from streams.events import DecodeError, decode_event, encode_event, event_id, make_event
from streams.outcomes import Outcome, infra_outcome
from streams.payloads import Limits, RolloutRequested, TrajectoryFinished, TrajectoryStarted, TurnGenerated


def turn(tokens: list[int], logprobs: list[float]) -> TurnGenerated:
    return TurnGenerated(
        turn=1,
        observation_token_ids=tokens[:3],
        output_token_ids=tokens,
        output_logprobs=logprobs,
        output_versions=[2] * len(tokens),
        finish_reason="stop",
        engine_id="e0",
        weight_version=2,
        context_tokens=len(tokens) + 3,
        latency_s=0.25,
    )


def test_ids_are_deterministic_per_key_and_seq() -> None:
    a = make_event(turn([1], [-0.5]), run_id="r", seq=4, time_ns=1, source="w1", trajectory_id="t")
    b = make_event(turn([1], [-0.5]), run_id="r", seq=4, time_ns=99, source="w2", trajectory_id="t")
    assert a.id == b.id == event_id("t", 4)  # a re-emission after a crash gets the same id
    assert event_id("t", 5) != a.id and event_id("u", 4) != a.id


@given(
    st.lists(st.integers(min_value=-(2**31), max_value=2**31 - 1), max_size=300),
    st.data(),
)
def test_token_arrays_round_trip_packed(tokens: list[int], data: st.DataObject) -> None:
    logprobs = data.draw(
        st.lists(st.floats(allow_nan=False, max_value=0.0), min_size=len(tokens), max_size=len(tokens))
    )
    event = make_event(turn(tokens, logprobs), run_id="r", seq=1, time_ns=5, source="w", trajectory_id="t")
    wire = encode_event(event)
    assert decode_event(wire) == event
    assert isinstance(json.loads(wire)["data"]["output_token_ids"], str)  # packed, not a JSON list


def test_json_lists_still_read() -> None:
    event = make_event(
        turn([5, 6], [-1.0, -2.0]), run_id="r", seq=1, time_ns=5, source="w", trajectory_id="t"
    )
    raw = json.loads(encode_event(event))
    raw["data"]["output_token_ids"] = [5, 6]
    raw["data"]["output_logprobs"] = [-1.0, -2.0]
    assert decode_event(json.dumps(raw)) == event


def test_token_arrays_are_typed_arrays_in_memory() -> None:
    data = turn([7, 8, 9], [-0.5, -0.25, -1.0])
    assert isinstance(data.output_token_ids, array) and data.output_token_ids.typecode == "i"
    assert isinstance(data.output_logprobs, array) and data.output_logprobs.typecode == "d"
    assert data.output_token_ids.tolist() == [7, 8, 9]
    assert TrajectoryStarted(attempt=0, group_size=1, limits=Limits()).prompt_token_ids == array("i")
    source = [1, 2, 3]
    copied = turn(source, [0.0] * 3)
    source.append(4)  # the event holds its own copy
    assert copied.output_token_ids.tolist() == [1, 2, 3]
    back = decode_event(encode_event(make_event(data, run_id="r", seq=1, time_ns=1, source="w")))
    assert back.data.output_token_ids.typecode == "i" and back.data.output_logprobs.typecode == "d"


@pytest.mark.parametrize(
    ("tokens", "needle"),
    [([2**31], "int32"), ([1, "two"], "int32"), ([0.5], "int32"), ({"a": 1}, "list of numbers")],
)
def test_bad_token_arrays_are_refused_with_the_reason(tokens: object, needle: str) -> None:
    with pytest.raises(ValidationError, match=needle):
        TrajectoryStarted(attempt=0, group_size=1, limits=Limits(), prompt_token_ids=tokens)  # type: ignore[arg-type]


def test_finished_reward_and_outcome() -> None:
    done = TrajectoryFinished(
        outcome=infra_outcome("sandbox_start"),
        reward=None,
        turns=0,
        generated_tokens=0,
        context_tokens=0,
        last_seq=3,
    )
    event = make_event(done, run_id="r", seq=3, time_ns=1, source="w", trajectory_id="t", group_id="g")
    back = decode_event(encode_event(event))
    assert back.data.outcome is Outcome.INFRA_SANDBOX_START
    assert back.data.outcome.is_infra_error and not back.data.outcome.is_scored
    assert back.key == b"g"


@pytest.mark.parametrize(
    ("wire", "needle"),
    [
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"type": "nope"}', "unknown event type"),
        (b'{"type": "tests.ran", "schema_version": "1", "data": {}}', "schema_version"),
        (b'{"type": "tests.ran", "schema_version": 1, "data": 3}', "data must be an object"),
        (b'{"type": "tests.ran", "schema_version": 9, "data": {}}', "newer than this reader"),
    ],
)
def test_decode_errors_say_what_is_wrong(wire: bytes, needle: str) -> None:
    with pytest.raises(DecodeError, match=needle):
        decode_event(wire)


def test_schema_violation_names_the_field() -> None:
    event = make_event(turn([1], [-0.1]), run_id="r", seq=1, time_ns=1, source="w", trajectory_id="t")
    raw = json.loads(encode_event(event))
    raw["data"]["turn"] = 0
    with pytest.raises(DecodeError, match=r"data\.turn|turn"):
        decode_event(json.dumps(raw))
    raw["data"]["output_token_ids"] = "not base64!"
    with pytest.raises(DecodeError, match="output_token_ids"):
        decode_event(json.dumps(raw))


def test_old_versions_are_upcast(monkeypatch: pytest.MonkeyPatch) -> None:
    """A v1 `rollout.requested` without `retry` is read by a v2 reader through its upcaster."""
    monkeypatch.setattr(RolloutRequested, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(ev.UPCASTERS, ("rollout.requested", 1), lambda d: {**d, "retry": 7})
    v1 = {
        "id": str(event_id("t", 0)),
        "type": "rollout.requested",
        "schema_version": 1,
        "run_id": "r",
        "trajectory_id": "t",
        "seq": 0,
        "time_ns": 1,
        "source": "w",
        "data": {"task_dir": "task-1", "attempt": 1, "group_size": 8},
    }
    event = decode_event(json.dumps(v1))
    assert event.schema_version == 2 and event.data.retry == 7
    monkeypatch.delitem(ev.UPCASTERS, ("rollout.requested", 1))
    with pytest.raises(DecodeError, match="no upcaster"):
        decode_event(json.dumps(v1))


def test_records_without_a_group_are_keyed_by_run() -> None:
    """Compacted topics (`weights`) reject unkeyed records; the run is the key there."""
    from streams.payloads import WeightsPublished

    event = make_event(
        WeightsPublished(version=3, path="/m/3"), run_id="run-7", seq=3, time_ns=1, source="trainer"
    )
    assert event.key == b"run-7"
