"""The gateway's counters, served as Prometheus text at `GET /metrics`.

`rollstream_gateway_history_drifts_total{reason}` counts calls whose history a client changed
(re-rendered, masked from the loss: `HistoryDrift`); the same drifts are on the log, per turn
and per trajectory, for SQL.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

PREFIX = "rollstream_gateway"


@dataclass
class GatewayMetrics:
    calls: Counter[str] = field(default_factory=Counter)  # answered, by HTTP status
    turns: int = 0  # calls the engine answered and the log recorded
    drifts: Counter[str] = field(default_factory=Counter)  # by reason
    tool_call_errors: int = 0  # outputs whose <tool_call> could not be read
    engine_errors: Counter[str] = field(default_factory=Counter)  # by EngineError kind
    sessions_opened: int = 0
    sessions_ended: Counter[str] = field(default_factory=Counter)  # by outcome

    def exposition(self, open_sessions: int) -> str:
        lines: list[str] = []

        def metric(
            name: str, kind: str, help_text: str, values: dict[str, int] | int, label: str = ""
        ) -> None:
            lines.append(f"# HELP {PREFIX}_{name} {help_text}")
            lines.append(f"# TYPE {PREFIX}_{name} {kind}")
            if isinstance(values, int):
                lines.append(f"{PREFIX}_{name} {values}")
                return
            for key, value in sorted(values.items()):
                lines.append(f'{PREFIX}_{name}{{{label}="{key}"}} {value}')

        metric(
            "calls_total",
            "counter",
            "chat completion calls answered, by HTTP status",
            dict(self.calls),
            "status",
        )
        metric("turns_total", "counter", "calls answered by the engine and written to the log", self.turns)
        metric(
            "history_drifts_total",
            "counter",
            "calls whose history was re-rendered",
            dict(self.drifts),
            "reason",
        )
        metric(
            "tool_call_errors_total",
            "counter",
            "outputs with an unreadable <tool_call>",
            self.tool_call_errors,
        )
        metric(
            "engine_errors_total",
            "counter",
            "engine calls that failed, by kind",
            dict(self.engine_errors),
            "kind",
        )
        metric("sessions_opened_total", "counter", "sessions opened", self.sessions_opened)
        metric(
            "sessions_ended_total",
            "counter",
            "sessions ended, by outcome",
            dict(self.sessions_ended),
            "outcome",
        )
        metric("sessions_open", "gauge", "sessions open now", open_sessions)
        return "\n".join(lines) + "\n"
