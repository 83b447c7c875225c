"""A killed run's partial copy and its re-run in the store: both kept, the finishing run projected.

A rollout worker killed mid-episode leaves a partial copy of a trajectory; the
re-run writes the same event ids from another source with other samples (here:
fewer turns, other token counts and latencies, later times). Whichever copy the
writer sees first, in one batch or two, the store keeps both copies, its
projections hold exactly the finishing run's rows, and replay from the store
equals replay of the same records as the topics have them.
"""

from __future__ import annotations

import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from streams.eventgen import NS, AttemptSpec, trajectory_events
from streams.events import Event
from streams.outcomes import Outcome
from streams.replay import RecordedRun, load_from_db, replay
from streams.settings import PolicySettings
from streams.store import StoredEvent, open_store, write_batch
from streams.store.migrate import alembic_config, create_store_engine, upgrade
from tests.store.batches import ends, positioned
from tests.store.expect import assert_projections, rows, scalar

RUN = "run-copies"
GROUP = f"{RUN}/g0"
T0 = 1_700_000_000 * NS
POLICY = PolicySettings(group_size=4, max_staleness=1)
PROJECTIONS = ("trajectories", "turns", "tool_calls", "sandbox_lifecycle")
OUTCOMES = [(Outcome.RESOLVED, 1.0), (Outcome.UNRESOLVED, 0.0)] * 2


def episodes() -> tuple[list[Event], list[Event], list[Event]]:
    """(the killed run's partial copy of attempt 0, its re-run, the group's other attempts)."""
    specs = [
        AttemptSpec(a, 0, 2 + a, outcome, reward, group_size=4, start_s=a * 0.1)
        for a, (outcome, reward) in enumerate(OUTCOMES)
    ]
    killed_spec = AttemptSpec(0, 0, 6, Outcome.RESOLVED, 1.0, output_tokens=5, turn_s=0.7, group_size=4)
    # cut before tests.ran: it got further than the re-run's whole episode, but never finished
    killed = trajectory_events(RUN, GROUP, killed_spec, t0_ns=T0, source="rollout-dead")[:-3]
    rerun = trajectory_events(RUN, GROUP, specs[0], t0_ns=T0 + 60 * NS, source="rollout-1")
    others = [
        e for spec in specs[1:] for e in trajectory_events(RUN, GROUP, spec, t0_ns=T0, source="rollout-2")
    ]
    assert len(killed) > len(rerun) and {e.id for e in rerun} < {e.id for e in killed}
    return killed, rerun, others


def arrivals(order: str) -> list[list[Event]]:
    """The batches the writer gets, in order."""
    killed, rerun, others = episodes()
    if order == "partial copy first":
        return [killed + others[:5], others[5:] + rerun]
    if order == "finishing copy first":
        return [rerun + others, killed]
    return [killed + others + rerun]  # both copies in one batch


def write(engine: Engine, batches: list[list[StoredEvent]]) -> None:
    for batch in batches:
        with engine.begin() as conn:
            write_batch(conn, batch, ends(batch), "sink")


def at_positions(batches: list[list[Event]]) -> list[list[StoredEvent]]:
    """The batches at consecutive offsets of one partition per topic, in arrival order."""
    stored = positioned([e for batch in batches for e in batch], partitions=1)
    out, first = [], 0
    for batch in batches:
        out.append(stored[first : first + len(batch)])
        first += len(batch)
    return out


def snapshot(engine: Engine, tables: tuple[str, ...]) -> dict[str, list[object]]:
    return {table: rows(engine, f"SELECT * FROM {table} ORDER BY 1, 2, 3") for table in tables}


@pytest.mark.parametrize("order", ["partial copy first", "finishing copy first", "one batch"])
def test_both_copies_are_kept_and_the_finishing_run_is_projected(db_url: str, order: str) -> None:
    killed, rerun, others = episodes()
    batches = arrivals(order)
    engine = open_store(db_url)
    write(engine, at_positions(batches))
    assert scalar(engine, "SELECT COUNT(*) FROM events") == len(killed) + len(rerun) + len(others)
    assert_projections(engine, rerun + others)  # trajectories, turns, tool_calls, sandboxes: the re-run's
    where = f"trajectory_id = '{rerun[0].trajectory_id}'"
    assert scalar(engine, f"SELECT started_ns FROM trajectories WHERE {where}") == rerun[0].time_ns
    assert rerun[0].time_ns != killed[0].time_ns

    topics = RecordedRun(RUN, [e for batch in batches for e in batch])
    from_db = load_from_db(db_url, RUN)
    assert sorted(map(str, (e.id for e in from_db.events))) == sorted(map(str, (e.id for e in topics.events)))
    assert replay(from_db, POLICY) == replay(topics, POLICY)
    assert len(replay(from_db, POLICY).trajectories) == 4

    before = snapshot(engine, ("events", *PROJECTIONS))
    write(engine, at_positions(batches))  # the sink re-reading the same records changes nothing
    assert snapshot(engine, ("events", *PROJECTIONS)) == before
    engine.dispose()


def test_until_the_rerun_finishes_the_first_copy_read_is_projected(db_url: str) -> None:
    """With no finished copy yet the first copy read wins at each seq (as in `dedupe_by_seq`);
    the re-run's `trajectory.finished` flips every row to the re-run's, in a later batch."""
    killed, rerun, _ = episodes()
    engine = open_store(db_url)
    batches = at_positions([killed, rerun[:4], rerun[4:-1], rerun[-1:]])
    write(engine, batches[:3])
    turns = {r.turn: r.event_id for r in rows(engine, "SELECT turn, event_id FROM turns")}
    assert turns == {e.data.turn: str(e.id) for e in killed if e.type == "turn.generated"}  # type: ignore[attr-defined]
    write(engine, batches[3:])
    assert_projections(engine, rerun)
    engine.dispose()


def test_migration_0003_carries_existing_rows_and_keys_events_by_copy(db_url: str) -> None:
    killed, rerun, others = episodes()
    previous = ScriptDirectory.from_config(alembic_config()).get_revision("0003").down_revision
    assert isinstance(previous, str)
    engine = create_store_engine(db_url)
    upgrade(engine, previous)
    # as a sink of that revision stored them: v1 rollout events, version 0 before the first turn
    written_then = [
        e.model_copy(update={"schema_version": 1, "policy_version": e.policy_version or 0})
        for e in rerun + others
    ]
    first, late = at_positions([written_then, killed])
    write(engine, [first])
    tables = ("events", *PROJECTIONS, "consumer_offsets")
    before = snapshot(engine, tables)
    assert inspect(engine).get_pk_constraint("events")["constrained_columns"] == ["id"]

    upgrade(engine)
    assert inspect(engine).get_pk_constraint("events")["constrained_columns"] == ["id", "source"]
    assert snapshot(engine, tables) == before
    write(engine, [late])
    assert scalar(engine, "SELECT COUNT(*) FROM events") == len(rerun) + len(others) + len(killed)
    assert_projections(engine, rerun + others)

    with engine.begin() as conn:  # down again: the first copy of each id in Kafka order stays
        config = alembic_config()
        config.attributes["connection"] = conn
        command.downgrade(config, previous)
    assert inspect(engine).get_pk_constraint("events")["constrained_columns"] == ["id"]
    kept = {(r.id, r.source) for r in rows(engine, "SELECT id, source FROM events")}
    expected = {(str(e.id), e.source) for e in rerun + others}
    expected |= {(str(e.id), e.source) for e in killed if e.seq > rerun[-1].seq}
    assert kept == expected
    engine.dispose()
