"""Revision 0002: trainer_steps gets TrainerStep v2's figures, weight_versions a checksum; old rows carry."""

from __future__ import annotations

import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text

from streams.events import make_event
from streams.payloads import StepTimes, TrainerStep, WeightsPublished
from streams.store.migrate import create_store_engine, upgrade
from streams.store.models import Base
from streams.store.rows import projection_rows
from streams.store.wire import to_wire
from streams.store.writer import upsert_projections
from trainer.publish import step_event

TABLES = ("trainer_steps", "weight_versions")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    name = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(name))


def _diffs_of_our_tables(conn: object) -> list[object]:
    context = MigrationContext.configure(conn, opts={"compare_type": True})  # type: ignore[arg-type]
    return [d for d in compare_metadata(context, Base.metadata) if any(t in repr(d) for t in TABLES)]


def test_rows_of_revision_0001_carry_over_and_v2_steps_project_every_field(db_url: str) -> None:
    engine = create_store_engine(db_url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO trainer_steps (run_id, step, event_id, version, groups, trajectories, loss,"
                " grad_norm, mean_logprob_diff, ess, times, time_ns)"
                " VALUES ('old', 1, 'e', 1, 2, 8, 0.5, 0.1, 0.01, 0.9, '{}', 5)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO weight_versions (run_id, version, event_id, step, path, published_ns, source)"
                " VALUES ('old', 1, 'e', 1, '/w/1', 5, 'trainer')"
            )
        )
    upgrade(engine, "0002")
    with engine.connect() as conn:
        assert _diffs_of_our_tables(conn) == []
        old = conn.execute(text("SELECT mode, tokens, ess_seq, loss FROM trainer_steps")).one()
        assert (old.mode, old.tokens, old.ess_seq, old.loss) == ("rl", 0, 1.0, 0.5)
        assert conn.execute(text("SELECT checksum FROM weight_versions")).scalar_one() == ""

    data = TrainerStep(
        step=2,
        version=2,
        groups=2,
        trajectories=8,
        group_ids=["g1", "g2"],
        loss=0.25,
        grad_norm=0.5,
        clip_frac_low=0.1,
        clip_frac_high=0.2,
        entropy=3.5,
        mean_logprob_diff=0.011,
        ess=0.93,
        ess_seq=0.8,
        reward_mean=0.375,
        zero_variance_groups=3,
        stale_groups=1,
        staleness_mean=1.5,
        staleness_max=2,
        tokens=96,
        times=StepTimes(wait_s=0.1, update_s=0.2, publish_s=0.05, total_s=0.35),
    )
    weights = make_event(
        WeightsPublished(version=2, path="/w/2", step=2, checksum="ab" * 32),
        run_id="new",
        seq=2,
        time_ns=time.time_ns(),
        source="trainer",
        id_key="new/weights.history",
    )
    with engine.begin() as conn:
        for event in (step_event("new", data, time.time_ns()), weights):
            upsert_projections(conn, projection_rows(to_wire(event)))
    with engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM trainer_steps WHERE run_id = 'new'")).mappings().one()
        checksum = conn.execute(
            text("SELECT checksum FROM weight_versions WHERE run_id = 'new'")
        ).scalar_one()
    expected = data.model_dump(exclude={"times", "group_ids"})
    assert {k: row[k] for k in expected} == expected
    assert _json(row["group_ids"]) == ["g1", "g2"]
    assert _json(row["times"])["publish_s"] == 0.05
    assert checksum == "ab" * 32
    engine.dispose()


def _json(value: object) -> object:
    import json

    return json.loads(value) if isinstance(value, str) else value
