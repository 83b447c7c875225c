"""Agents: the embedded engine and its client, the bash scaffold, rollout workers."""
