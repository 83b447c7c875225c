"""Which episode runs an agent (`agent.scaffold`): ours (`bash`) or mini-swe-agent behind the
session gateway. The rollout worker and evaluation start episodes through `new_episode`."""

from __future__ import annotations

from agents.episode import Episode, EpisodeServices, EpisodeSpec, EventSink


def new_episode(spec: EpisodeSpec, services: EpisodeServices, sink: EventSink) -> Episode:
    if services.agent.scaffold == "mini-swe-agent":
        from agents.mini_swe.episode import MiniSweEpisode  # imports mini-swe-agent's config reader

        return MiniSweEpisode(spec, services, sink)
    return Episode(spec, services, sink)
