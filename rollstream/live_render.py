"""Rich renderables of a run's live view (`rollstream.live_view.RunView`) and of a supervisor.

`render_run(view, processes, steps_shown=5)` is the whole screen: trajectories (requested,
queued, in flight, finished), outcomes, groups kept and dropped by reason, the latest
trainer steps with what the trainer waited for (a sentence that names what binds), the
weight version each engine serves, the cap waits with the one that binds, and the
supervisor's process table. `process_table(statuses)` alone is what
`rollstream up` shows without a run. Both are pure functions of their inputs;
`show_live` is the loop that draws them while a `RunFollower` reads the run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table

from rollstream.live_view import CAPS, RunFollower, RunView
from rollstream.supervisor import ProcessStatus, State, Supervisor
from trainer.waits import wait_reason

_STATE_STYLE = {
    State.RUNNING: "green",
    State.BACKOFF: "yellow",
    State.FAILED: "bold red",
    State.STOPPED: "dim",
    State.DONE: "cyan",
}


def process_table(statuses: Sequence[ProcessStatus]) -> Table:
    table = Table(title="processes", title_justify="left")
    for column in ("process", "pid", "state", "restarts", "last exit", "heartbeat", "up", "last restart"):
        table.add_column(
            column, justify="left" if column in ("process", "state", "last restart") else "right"
        )
    for s in statuses:
        beat = "-" if s.heartbeat_age_s is None else f"{s.heartbeat_age_s:.1f}s ago"
        table.add_row(
            s.name,
            str(s.pid or "-"),
            f"[{_STATE_STYLE[s.state]}]{s.state}[/]",
            str(s.restarts),
            "-" if s.last_exit is None else str(s.last_exit),
            beat,
            f"{s.uptime_s:.0f}s",
            s.last_reason or "-",
        )
    return table


def _trajectories(view: RunView) -> Table:
    table = Table(title="trajectories", title_justify="left")
    table.add_column("")
    table.add_column("n", justify="right")
    rows = (
        ("requested", len(view.requested)),
        ("queued", view.queued),
        ("in flight", view.in_flight),
        ("slots", view.slots or "-"),
        ("finished", len(view.finished)),
    )
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def _outcomes(view: RunView) -> Table:
    table = Table(title="outcomes", title_justify="left")
    table.add_column("outcome")
    table.add_column("n", justify="right")
    counts = view.outcomes()
    order = sorted(counts, key=lambda o: (o.startswith("infra_error"), o.startswith("truncated"), o))
    for outcome in order:
        style = "red" if outcome.startswith("infra_error") else "green" if outcome == "resolved" else ""
        table.add_row(f"[{style}]{outcome}[/]" if style else outcome, str(counts[outcome]))
    if not counts:
        table.add_row("-", "0")
    return table


def _groups(view: RunView) -> Table:
    table = Table(title="groups", title_justify="left")
    table.add_column("kept / dropped")
    table.add_column("n", justify="right")
    table.add_row("[green]kept[/]", str(view.kept))
    for reason, n in sorted(view.dropped().items()):
        table.add_row(f"dropped: {reason}", str(n))
    return table


def _steps(view: RunView, shown: int) -> Table:
    table = Table(
        title=f"trainer steps ({len(view.steps)}; versions published {len(view.versions)})",
        title_justify="left",
    )
    columns = ("step", "version", "reward mean", "grad norm", "|Δlogprob|", "ESS", "groups", "time", "waited")
    for column in columns:
        table.add_column(column, justify="right")
    for row in view.recent_steps(shown):
        table.add_row(
            str(row.step),
            str(row.version),
            f"{row.reward_mean:.3f}",
            f"{row.grad_norm:.3f}",
            f"{row.logprob_diff:.4f}",
            f"{row.ess:.3f}",
            str(row.groups),
            f"{row.total_s:.1f}s",
            _waited(row.times),
        )
    return table


def _waited(times: dict[str, float | None]) -> str:
    """A step's wait and what for: no group formed yet, a group's trajectories not read; the CPU."""
    wait = float(times.get("wait_s") or 0.0)
    groups, trajectories = (
        float(times.get("wait_groups_s") or 0.0),
        float(times.get("wait_trajectories_s") or 0.0),
    )
    parts = [f"groups {groups:.1f}", f"traj {trajectories:.1f}"] if groups or trajectories else []
    busy = times.get("wait_cpu_busy")
    if busy is not None:
        parts.append(f"cpu {busy:.0%}")
    return f"{wait:.1f}s" + (f": {', '.join(parts)}" if parts else "")


def _trainer_line(view: RunView, shown: int) -> str:
    """What binds the trainer; before its first step, whether it has anything to train on."""
    if not view.steps:
        dropped = ", ".join(f"{n} {reason}" for reason, n in sorted(view.dropped().items()))
        return f"[bold]trainer[/]: no step yet; groups kept {view.kept}" + (
            f", dropped {dropped}" if dropped else ""
        )
    return f"[bold]trainer[/] (last {shown} steps): {wait_reason(view.trainer_waits(shown))}"


def _engines(view: RunView) -> Table:
    table = Table(title="engines", title_justify="left")
    for column in ("engine", "weight version", "running", "queued"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for url, state in sorted(view.engines.items()):
        if state.weight_version is None:
            table.add_row(url, f"[red]down ({state.error})[/]", "-", "-")
        else:
            table.add_row(url, str(state.weight_version), str(state.running), str(state.queued))
    return table


def _caps(view: RunView) -> Table:
    binding = view.binding_cap()
    title = f"waits: binding cap [bold]{binding or 'none yet'}[/]"
    if view.slots_full():
        title += " (every rollout slot busy)"
    table = Table(title=title, title_justify="left")
    for column in ("cap", "waits", "total", "mean"):
        table.add_column(column, justify="left" if column == "cap" else "right")
    for cap in CAPS:
        wait = view.waits[cap]
        if wait.count == 0:
            continue  # a cap nobody waited on says nothing
        name = f"[bold]{cap}[/]" if cap == binding else cap
        table.add_row(name, str(wait.count), f"{wait.total_s:.1f}s", f"{wait.mean_s:.2f}s")
    if binding is None:
        table.add_row("-", "0", "-", "-")
    return table


def _side_by_side(*tables: Table) -> Table:
    grid = Table.grid(padding=(0, 2))
    for _ in tables:
        grid.add_column(vertical="top")
    grid.add_row(*tables)
    return grid


def render_run(
    view: RunView, processes: Sequence[ProcessStatus] = (), *, steps_shown: int = 5
) -> RenderableType:
    """The live screen of a run; `processes` from `Supervisor.status()` (empty: no table)."""
    parts: list[RenderableType] = [
        f"[bold]run {view.run_id or '(every run)'}[/] · {view.events} events",
        _side_by_side(_trajectories(view), _outcomes(view), _groups(view)),
        _steps(view, steps_shown),
        _trainer_line(view, steps_shown),
        _side_by_side(_engines(view), _caps(view)),
    ]
    if processes:
        parts.append(process_table(processes))
    return Group(*parts)


async def show_live(
    follower: RunFollower,
    console: Console,
    stop: asyncio.Event,
    *,
    supervisor: Supervisor | None = None,
    until: Callable[[RunView], bool] | None = None,
    steps_shown: int = 5,
) -> RunView:
    """Draw `follower.view` (and `supervisor`'s table) every `refresh_s` while the follower reads,
    until `stop` is set or `until(view)` holds. Each tick calls `supervisor.check_alive()`, so a
    process given up raises `ProcessExitedError` here (the follower is stopped first)."""
    view = follower.view
    reading = asyncio.Event()
    task = asyncio.create_task(follower.run(reading))

    def screen() -> RenderableType:
        return render_run(view, supervisor.status() if supervisor else (), steps_shown=steps_shown)

    try:
        with Live(screen(), console=console, refresh_per_second=4, transient=False) as live:
            while not stop.is_set() and not (until is not None and until(view)):
                if task.done():
                    task.result()  # a follower that failed raises here
                if supervisor is not None:
                    supervisor.check_alive()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), follower.settings.refresh_s)
                live.update(screen())
    finally:
        reading.set()
        await asyncio.gather(task, return_exceptions=True)
    return view
