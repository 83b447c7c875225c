"""The one generator of events, deterministic from its arguments: for tests, benchmarks and the
committed example records of the event schemas (`rollstream schemas write`).

It lives beside the event contract it writes (it was `bench/eventgen`, which made the product
import its benchmarks); it depends on `streams/` only.

Three shapes, for three kinds of caller:

- episodes and runs as the rollout worker writes them: `trajectory_events` (one
  episode: started, sandbox requested/ready or failed for an infrastructure error,
  per turn a `turn.generated` and a `tool.executed`, `tests.ran`, sandbox released,
  finished; gap-free seqs, deterministic ids), `group_events`, `random_attempts`
  (a realistic mix of outcomes, infra errors re-run) and `synthetic_run`; the stream
  processor, replay and worker tests and `bench streams` use them;
- `generate_events(n)`: exactly `n` events of every type the SQL sink stores (runs
  of such groups with a `group.formed` per group and a `trainer.step` and
  `weights.published` every few groups), and `short_topic(event)`, the topic each
  belongs on (the store and sink tests);
- `sample_event(kind, i)`: one plausible event of any type, sized by `tokens`, and
  `bench_mix` (the bus and sink benchmarks, the codec tests and the committed schema
  examples written by `rollstream schemas write`);
- `groups.synthetic_groups(spec)`: a recorded `groups`/`trajectories` log with kept,
  zero-variance and stale groups (the trainer tests and `bench trainer`).

Pure: times come from the arguments, randomness from seeds; nothing touches Kafka.
"""

from streams.eventgen.runs import (
    NS,
    AttemptSpec,
    generate_events,
    group_events,
    random_attempts,
    short_topic,
    synthetic_run,
    trajectory_events,
    trajectory_id_of,
    weights_event,
)
from streams.eventgen.samples import BENCH_MIX, bench_mix, sample_event, sample_payload

__all__ = [
    "BENCH_MIX",
    "NS",
    "AttemptSpec",
    "bench_mix",
    "generate_events",
    "group_events",
    "random_attempts",
    "sample_event",
    "sample_payload",
    "short_topic",
    "synthetic_run",
    "trajectory_events",
    "trajectory_id_of",
    "weights_event",
]
