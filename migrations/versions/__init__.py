"""Revisions of the event store schema, oldest first (alembic skips this file)."""
