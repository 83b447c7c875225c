"""Typed payloads of every event type (the `data` of an `Event`).

Rollout events (topic `rollout.events`) describe one episode step by step; the
derived payloads are what stream workers, the trainer and the control plane
write. Each class names its `SCHEMA_VERSION`; bump it and add an upcaster in
`streams.events.UPCASTERS` when a change would break reading old records.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from streams.outcomes import Outcome
from streams.packed import Logprobs, LossMask, TokenIds, empty
from streams.settings import PolicySettings

DropReason = Literal["zero_variance", "too_few_valid", "stale"]  # why a group is not trained on


class Payload(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    SCHEMA_VERSION: ClassVar[int] = 1


class RolloutPayload(Payload):
    """A rollout event's payload. v2: the envelope's `policy_version` is None until the episode's
    first generation says which version is in force (v1 wrote 0 there; read through
    `streams.events.ENVELOPE_UPCASTERS`)."""

    SCHEMA_VERSION: ClassVar[int] = 2


class Limits(BaseModel):
    """The length policies in force for an episode (DESIGN.md defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    max_turns: int = 80
    max_new_tokens_per_turn: int = 8192
    max_trajectory_tokens: int = 65536
    context_cap: int = 65536
    tool_output_chars: int = 10000


class TimeBreakdown(BaseModel):
    """Seconds an episode spent in each kind of work."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    llm_s: float = 0.0
    tool_s: float = 0.0
    sandbox_start_s: float = 0.0
    agent_install_s: float = 0.0
    tests_s: float = 0.0
    queue_s: float = 0.0
    total_s: float = 0.0


# ---- rollout events -------------------------------------------------------------


class TrajectoryStarted(RolloutPayload):
    attempt: int = Field(ge=0, description="index of the attempt within its group")
    retry: int = Field(default=0, ge=0, description="re-runs of this attempt after infra errors")
    group_size: int = Field(ge=1)
    limits: Limits
    prompt_token_ids: TokenIds = Field(
        default_factory=empty("i"),
        description="system + instance prompt; empty for a gateway session, whose prompt is its first "
        "call's messages (turn 1's observation_token_ids)",
    )
    scaffold: str = Field(default="bash", description="the agent: bash (ours), mini-swe-agent, gateway")


class SandboxRequested(RolloutPayload):
    backend: str


class SandboxReady(RolloutPayload):
    backend: str
    sandbox_id: str
    queue_wait_s: float = Field(ge=0)
    start_s: float = Field(ge=0)
    cap_waits: dict[str, float] = Field(
        default_factory=dict, description="seconds of the queue wait spent on each sandbox pool cap"
    )


class SandboxFailed(RolloutPayload):
    backend: str
    error_kind: str = Field(description="sandbox_start | sandbox_lost | timeout ...")
    message: str
    queue_wait_s: float = Field(default=0.0, ge=0)
    injected: bool = Field(default=False, description="caused by fault injection (sandbox.faults)")


class SandboxReleased(RolloutPayload):
    backend: str
    sandbox_id: str
    lifetime_s: float = Field(ge=0)


class HistoryDrift(BaseModel):
    """A gateway call whose messages were not an extension of what the engine had seen (the client
    edited, dropped or inserted a message, or changed its tools): its context was re-rendered from
    the messages. The previous context's first `offset` tokens stay, with their loss mask; the
    tokens after them left the context, and the re-rendered rest (this turn's observation) is
    masked: the policy did not generate it in that context."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    turn: int = Field(ge=1, description="the call whose request changed the history")
    message: int = Field(ge=0, description="index of the first message that differs from what was seen")
    offset: int = Field(ge=0, description="tokens of the previous context kept (where the re-render differs)")
    replaced_tokens: int = Field(ge=0, description="tokens of the previous context after offset, now gone")
    reason: str = Field(description="edited | dropped | inserted | tools: what the client changed")


class TurnGenerated(RolloutPayload):
    turn: int = Field(ge=1)
    observation_token_ids: TokenIds = Field(description="prompt tokens new since the last turn (mask 0)")
    output_token_ids: TokenIds
    output_logprobs: Logprobs
    output_versions: TokenIds = Field(description="weight version of each output token")
    finish_reason: str = Field(description="stop | length | abort")
    engine_id: str
    weight_version: int = Field(ge=0)
    context_tokens: int = Field(ge=0, description="tokens in the context after this turn")
    queue_wait_s: float = Field(default=0.0, ge=0)
    latency_s: float = Field(ge=0)
    drift: HistoryDrift | None = Field(
        default=None,
        description="set when this call's history was re-rendered: the context is the previous one's "
        "first drift.offset tokens, then observation_token_ids",
    )
    tool_call_error: str | None = Field(
        default=None, description="why the output's <tool_call> could not be read (it went out as content)"
    )


class ToolExecuted(RolloutPayload):
    turn: int = Field(ge=1)
    command: str
    exit_code: int | None
    output: str = Field(description="the output as shown to the model (head + tail when long)")
    output_bytes: int = Field(ge=0, description="full byte count before truncation")
    truncated: bool
    duration_s: float = Field(ge=0)
    timed_out: bool = False
    format_error: bool = Field(default=False, description="the reply had no single bash block")


class TestsRan(RolloutPayload):
    fail_to_pass: dict[str, bool]
    pass_to_pass: dict[str, bool]
    duration_s: float = Field(ge=0)
    reward: float


class RenderDrift(BaseModel):
    """Where a re-render of an episode's messages by the model's chat template differs from the
    tokens the engine saw (templates that rewrite history, e.g. Qwen3's dropping earlier reasoning).
    The trajectory keeps what the engine saw; this says where a re-render would not."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    turn: int = Field(ge=0, description="0: the prompt; n: assistant turn n or the observation after it")
    offset: int = Field(ge=0, description="character offset in the decoded context")
    seen: str = Field(description="the context the engine saw from there (an excerpt)")
    rendered: str = Field(description="what the template renders there (an excerpt)")


class TrajectoryFinished(RolloutPayload):
    outcome: Outcome
    reward: float | None = Field(description="None for infra errors: they are never scored")
    turns: int = Field(ge=0)
    generated_tokens: int = Field(ge=0)
    context_tokens: int = Field(ge=0)
    last_seq: int = Field(ge=0, description="seq of this event: the trajectory has last_seq + 1 events")
    error: str | None = None
    times: TimeBreakdown = Field(default_factory=TimeBreakdown)
    injected: bool = Field(
        default=False, description="the infra error was caused by fault injection (sandbox/client.faults)"
    )
    render_drift: RenderDrift | None = Field(
        default=None, description="where a re-render by the chat template differs from what the engine saw"
    )
    history_drifts: int = Field(default=0, ge=0, description="gateway calls whose history was re-rendered")
    history_drift: HistoryDrift | None = Field(default=None, description="the first of them")


# ---- derived and control records ------------------------------------------------


class TrajectoryAssembled(Payload):
    """A folded trajectory (topic `trajectories`).

    v2: `policy` is typed (`PolicySettings`, the worker's with the episode's length limits);
    v1 recorded it as a free-form dict (upcast in `streams.events.UPCASTERS`)."""

    SCHEMA_VERSION: ClassVar[int] = 2
    attempt: int
    retry: int = 0
    outcome: Outcome
    reward: float | None
    token_ids: TokenIds
    loss_mask: LossMask
    rollout_logprobs: Logprobs = Field(description="engine logprobs; 0.0 where loss_mask is 0")
    token_versions: TokenIds = Field(description="weight version per token; -1 for prompt tokens")
    prompt_tokens: int
    turns: int
    generated_tokens: int
    context_tokens: int
    times: TimeBreakdown
    policy: PolicySettings = Field(description="policies in force: the worker's, with the episode's limits")
    history_drifts: int = Field(default=0, ge=0, description="turns whose history a client changed (masked)")


class GroupFormed(Payload):
    """A GRPO group (topic `groups`): members with advantages, or a drop reason.

    v2: `policy` is typed (`PolicySettings`, with the episodes' length limits) and `dropped` is
    a `DropReason`; v1 had a free-form dict and string (upcast in `streams.events.UPCASTERS`)."""

    SCHEMA_VERSION: ClassVar[int] = 2

    members: list[str] = Field(description="trajectory ids in attempt order")
    rewards: list[float]
    advantages: list[float]
    loss_masked: list[bool] = Field(default_factory=list, description="overlong members with loss masked")
    dropped: DropReason | None = Field(default=None, description="why it is not trained on; None = kept")
    infra_errors: int = 0
    oldest_version: int = 0
    policy: PolicySettings = Field(description="policies in force: the worker's, with the episodes' limits")


class RolloutRequested(Payload):
    """Work for rollout workers (topic `rollout.requests`)."""

    task_dir: str = Field(description="task directory name within the worker's task root")
    attempt: int = Field(ge=0)
    retry: int = Field(default=0, ge=0)
    group_size: int = Field(ge=1)
    limits: Limits = Field(default_factory=Limits)


class RolloutAbort(Payload):
    """Control record: stop these episodes now and finish them as truncated."""

    trajectory_ids: list[str]
    reason: str = "group_deadline"


class WeightsPublished(Payload):
    """A new weight version (topics `weights`, compacted by run, and `weights.history`).

    `path` is a complete Hugging Face model directory; `checksum` is
    `trainer.versions.directory_sha256` of it, which an engine verifies before loading."""

    version: int = Field(ge=0)
    path: str
    step: int = 0
    checksum: str = Field(default="", description="sha256 over the directory's files; empty = unchecked")


class StepTimes(BaseModel):
    """Seconds of one trainer step, by phase, and what its wait was for (`trainer.waits`; the
    rest of `wait_s` is reading and judging records). Records without the split (0, 0, None)
    were written before the trainer recorded it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    wait_s: float = Field(default=0.0, ge=0, description="waiting for groups and their trajectories")
    wait_groups_s: float = Field(
        default=0.0, ge=0, description="of wait_s: no next group yet (its rollouts running, or not requested)"
    )
    wait_trajectories_s: float = Field(
        default=0.0, ge=0, description="of wait_s: a group formed, its member trajectories not read yet"
    )
    wait_cpu_busy: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="share of the machine's CPU busy during wait_s; None: not recorded",
    )
    logprob_s: float = Field(default=0.0, ge=0, description="trainer logprobs under the behaviour weights")
    update_s: float = Field(default=0.0, ge=0, description="forward/backward and optimiser step")
    comm_s: float = Field(
        default=0.0,
        ge=0,
        description="of logprob_s + update_s: inside data-parallel collectives (CPU ranks; 0 at one rank)",
    )
    publish_s: float = Field(
        default=0.0,
        ge=0,
        description="on the step's path: waiting for the version before to be out, then taking the weights",
    )
    publish_background_s: float = Field(
        default=0.0,
        ge=0,
        description="writing, hashing and announcing the version, beside the next step (not in total_s)",
    )
    total_s: float = Field(default=0.0, ge=0)


class TrainerStep(Payload):
    """One optimiser step (topic `trainer.steps`): what it trained on, its metrics, its time split."""

    SCHEMA_VERSION: ClassVar[int] = 2
    step: int = Field(ge=0)
    version: int = Field(ge=0, description="the weight version this step produced")
    mode: str = Field(default="rl", description="rl | sft")
    groups: int
    trajectories: int
    group_ids: list[str] = Field(default_factory=list, description="groups trained on, in batch order")
    loss: float
    grad_norm: float = Field(description="global grad norm before clipping")
    clip_frac_low: float = 0.0
    clip_frac_high: float = 0.0
    entropy: float = 0.0
    mean_logprob_diff: float = Field(default=0.0, description="mean |logprob(trainer) - logprob(engine)|")
    ess: float = Field(default=1.0, description="token-level ESS of importance weights, (Σw)²/(N·Σw²)")
    ess_seq: float = Field(default=1.0, description="sequence-level ESS")
    reward_mean: float = 0.0
    zero_variance_groups: int = Field(default=0, description="seen since the last step")
    stale_groups: int = Field(default=0, description="seen (or dropped here) since the last step")
    staleness_mean: float = 0.0
    staleness_max: int = 0
    tokens: int = Field(default=0, description="loss-masked tokens trained")
    times: StepTimes = Field(default_factory=StepTimes)


class DeadLetterRecord(Payload):
    reason: str
    topic: str
    partition: int
    offset: int
    key_b64: str | None
    value_b64: str
    consumer: str
