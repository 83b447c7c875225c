"""The event contract: one envelope, one typed payload per event type.

Every record on every Rollstream topic is an `Event`: identity (run, group,
trajectory, task), a per-trajectory gap-free `seq`, the weight version in force,
the time in UTC nanoseconds, the writing worker, and a typed `data` payload whose
model is chosen by `type` (see `PAYLOADS`). Ids are deterministic UUIDv5 of
(trajectory id or source, seq), so a worker that re-emits after a crash writes the
same ids and consumers deduplicate by id.

Each payload type has a `SCHEMA_VERSION`; records written under an older version
are upcast on read before validation: `UPCASTERS` bring a payload to the next
version, `ENVELOPE_UPCASTERS` the whole record where a version changed what an
envelope field means (v1 rollout events: `policy_version`, see
`_version_in_force_v1`). `encode_event`/`decode_event`
are the only wire format; `DecodeError` says what was wrong so the consumer can
dead-letter the record and go on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationError

from streams.payloads import (
    DeadLetterRecord,
    GroupFormed,
    Payload,
    RolloutAbort,
    RolloutRequested,
    SandboxFailed,
    SandboxReady,
    SandboxReleased,
    SandboxRequested,
    TestsRan,
    ToolExecuted,
    TrainerStep,
    TrajectoryAssembled,
    TrajectoryFinished,
    TrajectoryStarted,
    TurnGenerated,
    WeightsPublished,
)
from streams.settings import PolicySettings

EVENT_NAMESPACE = uuid.UUID("5b0f3c1e-7d2a-4f4e-9a51-2c1d3e4f5a6b")

PAYLOADS: dict[str, type[Payload]] = {
    "trajectory.started": TrajectoryStarted,
    "sandbox.requested": SandboxRequested,
    "sandbox.ready": SandboxReady,
    "sandbox.failed": SandboxFailed,
    "sandbox.released": SandboxReleased,
    "turn.generated": TurnGenerated,
    "tool.executed": ToolExecuted,
    "tests.ran": TestsRan,
    "trajectory.finished": TrajectoryFinished,
    "trajectory.assembled": TrajectoryAssembled,
    "group.formed": GroupFormed,
    "rollout.requested": RolloutRequested,
    "rollout.abort": RolloutAbort,
    "weights.published": WeightsPublished,
    "trainer.step": TrainerStep,
    "deadletter.record": DeadLetterRecord,
}
ROLLOUT_EVENT_TYPES = (
    "trajectory.started",
    "sandbox.requested",
    "sandbox.ready",
    "sandbox.failed",
    "sandbox.released",
    "turn.generated",
    "tool.executed",
    "tests.ran",
    "trajectory.finished",
)
TYPE_OF: dict[type[Payload], str] = {cls: name for name, cls in PAYLOADS.items()}
CURRENT_VERSIONS: dict[str, int] = {kind: payload.SCHEMA_VERSION for kind, payload in PAYLOADS.items()}


# (type, version written) -> function turning that version's `data` dict into the next version's.
def _trainer_step_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 kept the time split as a free-form dict; v2 types it (unknown keys are dropped)."""
    times = data.get("times") or {}
    known = ("wait_s", "logprob_s", "update_s", "publish_s", "total_s")
    return {**data, "times": {k: float(v) for k, v in times.items() if k in known}}


def _policy_v1(data: dict[str, Any]) -> dict[str, Any]:
    """v1 of `group.formed` and `trajectory.assembled` kept the policy in force as a free-form dict;
    v2 types it as `PolicySettings`: keys it does not know are dropped (v1 writers only wrote its
    keys), missing ones take its defaults."""
    policy = data.get("policy")
    if not isinstance(policy, dict):
        return data  # not a v1 record as written: validation says what is wrong
    return {**data, "policy": {k: v for k, v in policy.items() if k in PolicySettings.model_fields}}


UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("trainer.step", 1): _trainer_step_v1,
    ("group.formed", 1): _policy_v1,
    ("trajectory.assembled", 1): _policy_v1,
}

# Rollout events by where a v1 writer put them in an episode: before its first model call, or after one.
BEFORE_ANY_TURN = frozenset({"trajectory.started", "sandbox.requested", "sandbox.ready"})
AFTER_A_TURN = frozenset({"turn.generated", "tool.executed"})


def _version_in_force_v1(record: dict[str, Any]) -> dict[str, Any]:
    """v1 rollout workers wrote `policy_version` 0 until an episode's first generation and then the
    highest version any of its generations reported; v2 writes None until a generation says which
    version is in force. Read as v2: None where the v1 record cannot have known the version (every
    event before the first model call; `trajectory.finished` after none), the recorded value where a
    generation had set it (`turn.generated`, `tool.executed`, a finish after turns), and for the
    events that come either way (`tests.ran`, `sandbox.released`, `sandbox.failed`) a positive value
    as recorded and 0 as None: a v1 0 there is the made-up start unless the engine served version 0,
    which the record cannot tell (the turns' `output_versions` still can)."""
    kind, version = record.get("type"), record.get("policy_version")
    data = record.get("data")
    if kind in AFTER_A_TURN or version is None:
        return record
    if kind == "trajectory.finished" and isinstance(data, dict) and data.get("turns"):
        return record
    if kind in BEFORE_ANY_TURN or kind == "trajectory.finished" or version == 0:
        return {**record, "policy_version": None}
    return record


ENVELOPE_UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    (kind, 1): _version_in_force_v1 for kind in ROLLOUT_EVENT_TYPES
}


class DecodeError(ValueError):
    """A record that is not a valid event; `reason` is what the dead-letter record says."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def event_id(key: str, seq: int) -> uuid.UUID:
    """Deterministic id of the `seq`-th event of a trajectory (or of a source)."""
    return uuid.uuid5(EVENT_NAMESPACE, f"{key}#{seq}")


class Event(BaseModel):
    """The envelope. `data` is the payload model named by `type`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ENVELOPE_FIELDS: ClassVar[tuple[str, ...]] = (
        "id",
        "type",
        "schema_version",
        "run_id",
        "group_id",
        "trajectory_id",
        "task_id",
        "seq",
        "policy_version",
        "time_ns",
        "source",
        "causation_id",
    )

    id: uuid.UUID
    type: str
    schema_version: int = Field(ge=1)
    run_id: str
    group_id: str | None = None
    trajectory_id: str | None = None
    task_id: str | None = None
    seq: int = Field(ge=0)
    policy_version: int | None = Field(
        default=None, ge=0, description="the weight version in force; None where not known yet"
    )
    time_ns: int = Field(ge=0)
    source: str
    causation_id: uuid.UUID | None = None
    data: SerializeAsAny[Payload]

    @property
    def key(self) -> bytes:
        """The Kafka key: the group for rollout events, so a group stays on one partition;
        otherwise the run (compacted `weights` keeps the latest record per run)."""
        return (self.group_id or self.run_id).encode()


# `Event`'s fields but `type` and `data`, as `create_model` takes them (annotation, FieldInfo):
# the per-type envelope models of `streams.fast_decode` and `streams.store.wire` are built with them.
ENVELOPE_FIELD_DEFS: dict[str, Any] = {
    name: (info.annotation, info) for name, info in Event.model_fields.items() if name not in ("type", "data")
}


def make_event(
    data: Payload,
    *,
    run_id: str,
    seq: int,
    time_ns: int,
    source: str,
    group_id: str | None = None,
    trajectory_id: str | None = None,
    task_id: str | None = None,
    policy_version: int | None = None,
    causation_id: uuid.UUID | None = None,
    id_key: str | None = None,
) -> Event:
    """An event whose id derives from (`id_key` or trajectory id or source, seq)."""
    kind = TYPE_OF[type(data)]
    key = id_key or trajectory_id or source
    return Event(
        id=event_id(key, seq),
        type=kind,
        schema_version=type(data).SCHEMA_VERSION,
        run_id=run_id,
        group_id=group_id,
        trajectory_id=trajectory_id,
        task_id=task_id,
        seq=seq,
        policy_version=policy_version,
        time_ns=time_ns,
        source=source,
        causation_id=causation_id,
        data=data,
    )


def encode_event(event: Event) -> bytes:
    """The record's bytes: compact JSON, token arrays packed (`model_dump_json`, minus a str round trip)."""
    return event.__pydantic_serializer__.to_json(event)


def upcast_record(raw: dict[str, Any]) -> dict[str, Any]:
    """A record (envelope and `data`) written under an older schema version of its type, brought to
    the current one step by step: each step applies the envelope upcaster and then the payload
    upcaster registered for it (at least one must be)."""
    kind, version = raw["type"], raw["schema_version"]
    current = PAYLOADS[kind].SCHEMA_VERSION
    if version > current:
        raise DecodeError(f"{kind} schema_version {version} is newer than this reader ({current}); upgrade")
    while version < current:
        envelope_step = ENVELOPE_UPCASTERS.get((kind, version))
        data_step = UPCASTERS.get((kind, version))
        if envelope_step is None and data_step is None:
            raise DecodeError(f"no upcaster for {kind} from schema_version {version}")
        if envelope_step is not None:
            raw = envelope_step(raw)
        if data_step is not None:
            raw = {**raw, "data": data_step(raw["data"])}
        version += 1
    return {**raw, "schema_version": current}


def event_from_dict(raw: Any) -> Event:
    """Validate a decoded JSON object as an event, upcasting old versions."""
    if not isinstance(raw, dict):
        raise DecodeError(f"expected a JSON object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in PAYLOADS:
        raise DecodeError(f"unknown event type {kind!r}")
    version = raw.get("schema_version")
    if not isinstance(version, int):
        raise DecodeError(f"{kind}: schema_version must be an integer, got {version!r}")
    if not isinstance(raw.get("data"), dict):
        raise DecodeError(f"{kind}: data must be an object")
    try:
        current = upcast_record(raw)
        payload = PAYLOADS[kind].model_validate(current["data"])
        fields = {k: v for k, v in current.items() if k != "data"}
        return Event.model_validate({**fields, "data": payload})
    except ValidationError as error:
        raise DecodeError(f"{kind} does not match its schema: {_first_errors(error)}") from None


def decode_event(value: bytes | str) -> Event:
    """Bytes from Kafka (or a JSON line) to an `Event`; raises `DecodeError`."""
    try:
        raw = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise DecodeError(f"not JSON: {error}") from None
    return event_from_dict(raw)


def _first_errors(error: ValidationError, limit: int = 3) -> str:
    parts = []
    for item in error.errors()[:limit]:
        where = ".".join(str(p) for p in item["loc"]) or "(root)"
        parts.append(f"{where}: {item['msg']}")
    more = error.error_count() - limit
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
