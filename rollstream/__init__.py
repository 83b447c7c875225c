"""Rollstream's composition root: the CLI, the one TOML config, the local launcher and reports."""
