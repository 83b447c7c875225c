"""v1 `group.formed` / `trajectory.assembled` records (free-form policy dict) still decode, typed."""

from __future__ import annotations

import json

import pytest

from streams.eventgen import sample_event
from streams.events import DecodeError, decode_event, encode_event
from streams.payloads import GroupFormed, TrajectoryAssembled
from streams.settings import PolicySettings


def _as_v1(kind: str, policy: object, **data: object) -> bytes:
    raw = json.loads(encode_event(sample_event(kind, 1, tokens=6)))
    raw["schema_version"] = 1
    raw["data"] |= {"policy": policy, **data}
    return json.dumps(raw).encode()


@pytest.mark.parametrize("kind", ["group.formed", "trajectory.assembled"])
def test_v1_policy_dict_is_upcast_to_the_typed_policy(kind: str) -> None:
    recorded = {"group_size": 4, "max_turns": 12, "overlong": "drop", "retired_knob": 3}
    event = decode_event(_as_v1(kind, recorded))
    assert isinstance(event.data, GroupFormed | TrajectoryAssembled)
    assert event.schema_version == 2
    assert event.data.policy == PolicySettings(group_size=4, max_turns=12, overlong="drop")


def test_v1_drop_reason_outside_the_three_is_refused_with_the_reason() -> None:
    with pytest.raises(DecodeError, match="dropped"):
        decode_event(_as_v1("group.formed", {}, dropped="bored"))


def test_group_formed_accepts_only_the_three_drop_reasons() -> None:
    for reason in ("zero_variance", "too_few_valid", "stale"):
        assert GroupFormed(members=[], rewards=[], advantages=[], dropped=reason, policy={}).dropped == reason
