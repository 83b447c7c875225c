"""Sandboxes: the protocol, backends (bubblewrap, docker, e2b), pools with visible caps, Harbor tasks."""
