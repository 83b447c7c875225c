"""The reference run's tail figures as table rows: `rollstream tail`, `whatif` and the run summary."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table

from streams.tail import TailFigures


def figure_rows(figures: TailFigures) -> list[tuple[str, str]]:
    def opt(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    return [
        ("trajectories", str(figures.trajectories)),
        ("share at the turn cap", f"{figures.at_turn_cap_share:.1%}"),
        ("median turns of resolved", opt(figures.median_turns_resolved, ".1f")),
        ("wall time after 90% finished", f"{figures.tail_share:.1%}"),
        ("rollout wall time", f"{figures.wall_s:.1f} s"),
        (
            "slowest trajectory",
            f"{figures.slowest_trajectory} ({figures.slowest_s:.1f} s, {figures.slowest_turns} turns)",
        ),
        ("group max/min turns, median", opt(figures.group_length_ratio_median, ".2f")),
        ("group max/min turns, max", opt(figures.group_length_ratio_max, ".2f")),
    ]


def figures_table(title: str, rows: Iterable[tuple[str, object]]) -> Table:
    """A two-column (figure, value) table; the tail command's and the run summary's."""
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name, value in rows:
        table.add_row(name, str(value))
    return table
