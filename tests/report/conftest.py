"""Fixtures of the report tests: one database URL per backend (real SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on each backend."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
