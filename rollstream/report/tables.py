"""The report's tables (pure: rows in, strings out): the headline figures, and the outcomes
table that the page and the demo's console both show (`OUTCOME_COLUMNS`, `outcome_cells`)."""

from __future__ import annotations

from rollstream.report.figures import NS
from rollstream.report.queries import OutcomeRow, RunRows
from rollstream.report.settings import ReportSettings
from streams.tail import tail_share


def summary(rows: RunRows, settings: ReportSettings) -> dict[str, str]:
    """The page's headline figures (name -> formatted value)."""
    scored = sum(v.scored for v in rows.versions)
    resolved = sum(v.resolved for v in rows.versions)
    finished = sum(n for _, n in rows.outcomes)
    out = {
        "trajectories finished": str(finished),
        "scored attempts": str(scored),
        "pass@1 (all versions)": f"{resolved / scored:.1%}" if scored else "-",
        "weight versions": _version_list([v.version for v in rows.versions if v.version is not None]),
        "trainer steps": str(len(rows.steps)),
    }
    if rows.spans_ns:
        spans = [(s / NS, e / NS) for s, e in rows.spans_ns]
        out[f"wall time after {settings.finished_fraction:.0%} finished"] = (
            f"{tail_share(spans, settings.finished_fraction):.1%}"
        )
    return out


OUTCOME_COLUMNS = (
    "outcome",
    "n",
    "turns",
    "verifier reward",
    "trained on",
    "trainer reward",
    "seconds",
)
OUTCOME_CAPTION = (
    "by outcome: means of turns, rewards and seconds; the trainer's reward over those it trained on"
)


def outcome_cells(row: OutcomeRow) -> tuple[str, ...]:
    """One row of the outcomes table, in `OUTCOME_COLUMNS` order ("-": none)."""

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    return (
        row.outcome,
        str(row.trajectories),
        fmt(row.mean_turns),
        fmt(row.verifier_reward),
        str(row.trained),
        fmt(row.trained_reward),
        fmt(row.mean_s),
    )


def _version_list(versions: list[int]) -> str:
    """ "2-17" for a run of consecutive versions, else the versions one by one."""
    if not versions:
        return "-"
    if len(versions) > 2 and versions == list(range(versions[0], versions[-1] + 1)):
        return f"{versions[0]}-{versions[-1]}"
    return ", ".join(map(str, versions))
