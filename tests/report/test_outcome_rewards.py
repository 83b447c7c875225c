"""The outcomes table shows the verifier's reward beside the one the trainer used.

Under `policy.overlong="zero"` (the demo's setting) a truncated episode whose tests passed has a
verifier reward of 1 but trains as a failure; a member of a group dropped for zero variance is not
trained on at all. Groups are formed by the real stream processor from rollout events and both are
written to the store (SQLite and PostgreSQL); the console table and the report page read it.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from rollstream.report.build import write_run_report
from rollstream.report.queries import OutcomeRow, outcome_rewards
from rollstream.run_summary import sql_summary
from streams.eventgen import AttemptSpec, group_events
from streams.events import Event
from streams.outcomes import Outcome
from streams.processor import Emit, StreamProcessor
from streams.settings import PolicySettings
from streams.store import open_store
from tests.store.batches import positioned, write_in_batches

RUN = "overlong-run"
R, U, T = Outcome.RESOLVED, Outcome.UNRESOLVED, Outcome.TRUNCATED_TURNS


def run_events() -> list[Event]:
    kept = [(R, 1.0), (U, 0.0), (T, 1.0), (T, 0.0)]  # one truncated episode passed its tests
    all_failed = [(U, 0.0)] * 4  # zero variance: dropped, never trained
    events: list[Event] = []
    for index, attempts in enumerate((kept, all_failed)):
        specs = [
            AttemptSpec(a, 0, 2, o, r, group_size=4, start_s=a * 0.1) for a, (o, r) in enumerate(attempts)
        ]
        events += group_events(RUN, f"{RUN}/g{index}", specs)
    processor = StreamProcessor(PolicySettings(group_size=4, overlong="zero"))
    groups = [
        out.event
        for e in events
        for out in processor.feed(e)
        if isinstance(out, Emit) and out.topic == "groups"
    ]
    assert [g.data.dropped for g in groups] == [None, "zero_variance"]  # type: ignore[attr-defined]
    return events + groups


def test_truncated_episodes_show_the_reward_they_trained_with(db_url: str, tmp_path: Path) -> None:
    write_in_batches(db_url, positioned(run_events()))
    with open_store(db_url).connect() as conn:
        rows = {row.outcome: row for row in outcome_rewards(conn, RUN)}
    assert rows["truncated:turns"] == OutcomeRow(
        "truncated:turns", 2, 2.0, 0.5, 2, 0.0, rows["truncated:turns"].mean_s
    )
    assert (rows["resolved"].verifier_reward, rows["resolved"].trained, rows["resolved"].trained_reward) == (
        1.0,
        1,
        1.0,
    )
    assert (rows["unresolved"].trajectories, rows["unresolved"].trained) == (5, 1)  # 4 in the dropped group

    console = Console(width=200, record=True)
    console.print(sql_summary(db_url, RUN))
    text = console.export_text()
    assert "verifier reward" in text and "trainer reward" in text
    line = next(line for line in text.splitlines() if "truncated:turns" in line)
    assert [cell.strip() for cell in line.split("│")[1:-1]][:6] == [
        "truncated:turns",
        "2",
        "2.00",
        "0.50",
        "2",
        "0.00",
    ]

    page = write_run_report(db_url, RUN, tmp_path / "report").page.read_text()
    assert "<th>trainer reward</th>" in page and "<td>truncated:turns</td>" in page
