"""The local PostgreSQL server: databases are created, and dropped even with open sessions."""

from __future__ import annotations

import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text

from rollstream.launcher.postgres import create_database, drop_database
from rollstream.launcher.process import LauncherError


def test_create_use_and_force_drop(pg_server: str) -> None:
    name = f"t_{uuid.uuid4().hex[:10]}"
    url = create_database(pg_server, name)
    assert url.endswith(f"/{name}")
    assert create_database(pg_server, name) == url  # already there: kept
    engine = create_engine(url)
    conn = engine.connect()
    assert conn.execute(text("SELECT current_database()")).scalar() == name
    drop_database(pg_server, name)  # while this session is open
    conn.invalidate()
    engine.dispose()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"host=127.0.0.1 port=15432 user=rollstream dbname={name}", connect_timeout=5)
    drop_database(pg_server, name)  # gone already: harmless


def test_database_names_are_checked(pg_server: str) -> None:
    with pytest.raises(LauncherError, match="must match"):
        create_database(pg_server, 'x"; DROP DATABASE postgres; --')
